"""Head pruning (docs/model.md section 7): theory on order parameters, simulation on weights, CLI."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from _tiny import tiny
from helpers import random_overlaps, weights_with_overlaps
from scipy import stats

from singleloc import OrderParameterODE, load_config
from singleloc.bayes._bayes import bayes_point
from singleloc.bayes._population_risk import layer_risk
from singleloc.cli import main
from singleloc.io._run_folders import save_run
from singleloc.preflight._build import build
from singleloc.pruning._pruning import TheoryRisk, WeightsRisk, prune, prune_theory, prune_weights
from singleloc.pruning._pruning_result import removable_heads

ACTIVATIONS = ("softmax", "softmax1", "bsoftmax")


def small_config(activation="bsoftmax", H=3, F=2, points=1024, L=4, strength=2.0, route="auto"):
    """A layer of ``H`` heads on the users' default route, or on the Sobol rule (``route="rule"``) where
    a test's subject is the rule or the order of removals (greedy over four heads on the exact route
    compiles the risk and its finer check of every subset size: eight programs of minutes)."""
    return load_config(None).replace(
        problem={"L": L, "F": F, "strength": strength},
        model={"heads": H, "activation": activation, "train_bias": activation != "softmax"},
        theory={"points": points, "route": route},
    )


def random_layer(rng, H, F, scale=1.5):
    """Order parameters of real keys: M random, Q = M M^T + R_orth with R_orth PSD."""
    return random_overlaps(rng, H, F, m=scale, r=0.6 / np.sqrt(H), b=0.5)


def risk_with_heads(cfg, M, Q, b):
    """Population risk of a layer of len(b) heads, from an ODE object built for that many heads,
    on the evaluation scrambling (independent of the nodes that drive the dynamics)."""
    ode = OrderParameterODE.from_setup(build(cfg.replace(model={"heads": len(b)},
                                                       theory={"qmc_seed": cfg.theory.evaluation_seed})))
    return float(layer_risk(ode.expectation, *(jnp.asarray(x, float) for x in (M, Q, b))))  # jitted: prune's programs


# -- theory -------------------------------------------------------------------------------


def test_no_pruning_and_one_head(rng):
    """k = 0 removed is the unpruned risk; H - 1 removed is the single-head model of the kept
    head, built directly with one head (bsoftmax, whose factor H must become H')."""
    H, F = 3, 2
    cfg = small_config("bsoftmax", H, F)
    M, Q, b = random_layer(rng, H, F)
    res = prune_theory(cfg, M, Q, b, [2, 0])
    assert res.risks.shape == (1, H)
    assert res.risk[0] == pytest.approx(risk_with_heads(cfg, M, Q, b), abs=1e-12)
    assert res.risk[H - 1] == pytest.approx(risk_with_heads(cfg, M[1:2], Q[1:2, 1:2], b[1:2]), abs=1e-12)
    # the two-head step keeps heads 0 and 1
    assert res.risk[1] == pytest.approx(risk_with_heads(cfg, M[:2], Q[:2, :2], b[:2]), abs=1e-12)



def test_replicated_theory_risk_carries_its_quadrature_error(rng):
    """With theory.replicates = R the risk of each kept subset is the mean over R scramblings
    and its standard error covers the distance to a reference rule of 16 times the points (the Sobol rule's
    replicates: its subject)."""
    H, F = 3, 2
    cfg = small_config("softmax1", H, F, points=256).replace(theory={"replicates": 6, "route": "rule"})
    M, Q, b = random_layer(rng, H, F)
    res = prune_theory(cfg, M, Q, b, [1, 0])
    assert res.stderr.shape == (1, H) and np.all(res.stderr > 0) and np.all(res.stderr < 0.01)
    fine = small_config("softmax1", H, F, points=256 * 16).replace(theory={"route": "rule"})
    for k, kept in enumerate(([0, 1, 2], [0, 2], [2])):
        reference = risk_with_heads(fine, M[kept], Q[np.ix_(kept, kept)], b[kept])
        assert abs(res.risks[0, k] - reference) < 4 * res.stderr[0, k] + 1e-4, (k, res.risks[0, k], reference, res.stderr)
    assert prune_theory(cfg.replace(theory={"replicates": 1}), M, Q, b, [1, 0]).stderr is None  # one rule: no estimate


def test_cli_prune_prints_the_quadrature_error(tmp_path, capsys):
    """The bsoftmax Bayes layer of two spikes: either head removed raises the risk (on the Sobol rule with
    replicates: its subject is the rule's standard error)."""
    out = tmp_path / "run"
    cfg = small_config("bsoftmax", 2, 2, points=256).replace(theory={"replicates": 3, "route": "rule"})
    M, Q, b = (np.asarray(x) for x in bayes_point(cfg.problem.build_prior()))
    T = 2
    save_run(out, cfg, {"theory.npz": {"tau": np.arange(T, dtype=float), "M": np.repeat(M[None], T, 0),
                                       "Q": np.repeat(Q[None], T, 0), "b": np.repeat(b[None], T, 0), "risk": np.zeros(T)}})
    assert main(["prune", str(out), "--tol", "0"]) == 0
    text = capsys.readouterr().out
    with np.load(out / "prune.npz") as d:
        risks, se = d["theory_risks"][0], d["theory_stderr"][0]
        route = str(d["route"])
    assert "+- quadrature SE" in text and f"{risks[1]:.4f} +- {se[1]:.4f}" in text
    assert route == "rule" and "on the rule route" in text
    k = removable_heads(risks, 0.0) + 1  # the first harmful removal
    assert k == 1 and f"removing {k} raises it by {risks[k] - risks[0]:.4f} +- {np.hypot(se[k], se[0]):.4f}" in text


@pytest.mark.exact_route
def test_cli_prune_on_the_exact_route_says_so_and_agrees_with_the_rule(tmp_path, capsys):
    """The same Bayes layer on the user's default route (exact for bsoftmax's two heads): the table
    names the route and its stated error (against a finer exact rule, far under 1e-5), and the risks
    agree with six independent Sobol rules of 4096 points within four of their standard errors."""
    out = tmp_path / "run"
    cfg = small_config("bsoftmax", 2, 2, points=256)
    M, Q, b = (np.asarray(x) for x in bayes_point(cfg.problem.build_prior()))
    save_run(out, cfg, {"theory.npz": {"tau": np.arange(2.0), "M": np.repeat(M[None], 2, 0), "Q": np.repeat(Q[None], 2, 0),
                                       "b": np.repeat(b[None], 2, 0), "risk": np.zeros(2)}})
    assert main(["prune", str(out), "--tol", "0"]) == 0
    text = capsys.readouterr().out
    with np.load(out / "prune.npz") as d:
        risks, err, route = d["theory_risks"][0], d["theory_stderr"][0], str(d["route"])
    assert route == "exact" and "on the exact route" in text and "+- stated error" in text
    assert np.all(err < 1e-6)
    rule = prune_theory(small_config("bsoftmax", 2, 2, points=4096).replace(theory={"replicates": 6, "route": "rule"}),
                        M, Q, b, [int(i) for i in np.load(out / "prune.npz")["theory_removed"][0]])
    assert np.all(np.abs(rule.risks[0] - risks) < 4 * rule.stderr[0] + 1e-6), (risks, rule.risks, rule.stderr)

def _single_head_mc(activation, M, Q, b, L, strength, F, n, rng):
    """Independent numpy Monte Carlo of the limit risk of ONE head, spikes prior:
    g_l = sqrt(Q) w_l, g_eps += M . theta, s = g + b, a = act(s) (one head: a = A)."""
    f = rng.integers(F, size=n)
    theta_dot_m = strength * M[f]
    g = np.sqrt(Q) * rng.standard_normal((n, L))
    g[:, 0] += theta_dot_m
    s = g + b
    m = np.maximum(s.max(axis=1, keepdims=True), 0.0)
    e = np.exp(s - m)
    if activation == "softmax1":
        a = e / (np.exp(-m) + e.sum(axis=1, keepdims=True))
    else:  # softmax, and bsoftmax with one head
        a = e / e.sum(axis=1, keepdims=True)
    loss = (1 - a[:, 0]) ** 2 + np.sum(a[:, 1:] ** 2, axis=1)
    return loss.mean(), loss.std(ddof=1) / np.sqrt(n)


@pytest.mark.parametrize("activation", [pytest.param("softmax", marks=pytest.mark.slow), "softmax1",
                                        pytest.param("bsoftmax", marks=pytest.mark.slow)])
def test_one_head_matches_independent_monte_carlo(rng, activation):
    """Pruning down to one head gives the risk of that head alone, checked against a numpy
    Monte Carlo that shares no code with the package (tolerance: 5 standard errors)."""
    H, F, L, strength = 3, 2, 4, 2.0
    cfg = small_config(activation, H, F, points=4096, L=L, strength=strength)
    M, Q, b = random_layer(rng, H, F)
    res = prune_theory(cfg, M, Q, b, [0, 2])
    mc, se = _single_head_mc(activation, M[1], Q[1, 1], b[1], L, strength, F, 400_000, rng)
    assert abs(res.risk[-1] - mc) < 5 * se, (res.risk[-1], mc, se)


def test_renormalisation_over_kept_heads(rng):
    """bsoftmax: heads with a very negative bias carry no weight, so removing them leaves the
    risk unchanged (the factor H becomes H'); softmax cannot switch them off, and its
    uniform average over the kept heads changes when they go. The rules for 4 and 2 heads
    are different quadratures: at 8192 points their error is ~3e-4 (the spread of the risk
    over rescramblings), hence the tolerance (and the rule: four exact bsoftmax heads compile for minutes)."""
    F = 2
    M = np.array([[2.0, 0.0], [0.0, 2.0], [0.3, 0.2], [0.1, 0.3]])
    Q = M @ M.T + np.diag([0.05, 0.05, 1.0, 1.0])
    b = np.array([0.0, 0.0, -40.0, -40.0])
    cfg = small_config("bsoftmax", 4, F, strength=2.0, points=8192, route="rule")
    res = prune_theory(cfg, M, Q, b, "greedy")
    assert sorted(res.removed[0, :2]) == [2, 3]
    assert res.risk[2] == pytest.approx(res.risk[0], abs=2e-3)
    assert res.risk[3] > res.risk[2] + 0.05  # one spike head cannot serve both spikes
    soft = TheoryRisk(build(small_config("softmax", 4, F, strength=2.0, points=8192, route="rule")), M, Q, b)
    assert soft([0, 1])[0] < soft([0, 1, 2, 3])[0] - 0.01  # the useless heads added noise


@pytest.mark.parametrize("activation", ["softmax", *(pytest.param(a, marks=pytest.mark.slow) for a in ACTIVATIONS[1:])])
def test_greedy_first_removal_is_best(rng, activation):
    """Greedy's first removal is the best single removal: <= alignment and every random draw,
    and equal to the minimum over all H single removals computed directly (the orders compared on
    one rule: the subject is the search, small_config; the other activations, whose risks the search only reads, slow)."""
    H, F = 4, 2
    cfg = small_config(activation, H, F, points=512, route="rule")
    M, Q, b = random_layer(rng, H, F)
    greedy = prune_theory(cfg, M, Q, b, "greedy")
    align = prune_theory(cfg, M, Q, b, "alignment")
    rand = prune_theory(cfg, M, Q, b, "random", draws=6, seed=1)
    singles = [risk_with_heads(cfg, np.delete(M, h, 0), np.delete(np.delete(Q, h, 0), h, 1), np.delete(b, h)) for h in range(H)]
    assert greedy.risk[1] == pytest.approx(min(singles), abs=1e-12)
    assert greedy.removed[0, 0] == int(np.argmin(singles))
    assert greedy.risk[1] <= align.risk[1] + 1e-12
    assert np.all(greedy.risk[1] <= rand.risks[:, 1] + 1e-12)
    # alignment removes the smallest |M_h| first
    norms = np.sqrt((M**2).sum(axis=1))
    assert list(align.removed[0]) == list(np.argsort(norms)[: H - 1])
    # every order ends on a single head and starts from the same unpruned risk
    assert greedy.risk[0] == align.risk[0] == pytest.approx(rand.risks[0, 0])
    assert rand.risks.shape == (6, H) and rand.removed.shape == (6, H - 1)
    assert np.allclose(rand.risk, rand.risks.mean(axis=0))
    for row in rand.removed:
        assert len(set(row)) == H - 1


def test_random_orders_are_seeded(rng):
    H, F = 4, 2
    cfg = small_config("softmax1", H, F, points=256, route="rule")  # the seeding of the orders: one rule
    M, Q, b = random_layer(rng, H, F)
    a = prune_theory(cfg, M, Q, b, "random", draws=5, seed=3)
    b2 = prune_theory(cfg, M, Q, b, "random", draws=5, seed=3)
    c = prune_theory(cfg, M, Q, b, "random", draws=5, seed=4)
    assert np.array_equal(a.removed, b2.removed) and np.array_equal(a.risks, b2.risks)
    assert not np.array_equal(a.removed, c.removed)


def test_bad_orders():
    ev = lambda kept: (float(len(kept)), 0.0)  # noqa: E731
    with pytest.raises(ValueError, match="unknown pruning order"):
        prune(ev, 3, "largest")
    with pytest.raises(ValueError, match="distinct head indices"):
        prune(ev, 3, [0, 0])
    with pytest.raises(ValueError, match="distinct head indices"):
        prune(ev, 3, [0, 5])
    with pytest.raises(ValueError, match="alignment"):
        prune(ev, 3, "alignment")
    with pytest.raises(ValueError, match="draws"):
        prune(ev, 3, "random", draws=0)
    assert list(prune(ev, 3, [2, 1, 0]).risk) == [3.0, 2.0, 1.0]


def test_removable_heads():
    assert removable_heads([0.2, 0.2, 0.205, 0.3, 0.21], 0.01) == 2
    assert removable_heads([0.2, 0.19, 0.18], 0.01) == 2
    assert removable_heads([0.2, 0.3], 0.01) == 0


# -- theory against weights ---------------------------------------------------------------


@pytest.mark.parametrize("activation, route", [("softmax1", "rule"), ("bsoftmax", "rule"),
                                               pytest.param("softmax1", "auto", marks=pytest.mark.slow)])
def test_theory_matches_weights(rng, activation, route, orthogonal_spikes):
    """The same layer pruned in theory (order parameters) and by weights on fresh sequences,
    along the same order, agree within Monte Carlo error at every step. With the limit loss the
    scores have exactly the law of the theory at any D (tolerance 4.5 standard errors); the
    finite-D empirical loss differs from it by O((H + F + strength^2) / D), added to its tolerance."""
    H, F, D, strength = 4, 2, 1500, 2.0
    cfg = small_config(activation, H, F, points=2048, strength=strength, route=route)
    M, Q, b = random_layer(rng, H, F, scale=1.2)
    K, kstar = weights_with_overlaps(rng, M, Q, D, orthogonal_spikes)
    theory = prune_theory(cfg, M, Q, b, "greedy")
    order = list(theory.removed[0])
    lim = prune_weights(cfg, K.astype(np.float32), b, kstar.astype(np.float32), order, samples=40_000, key=11, loss="limit")
    assert np.all(np.abs(lim.risk - theory.risk) < 4.5 * lim.stderr[0]), (lim.risk, theory.risk, lim.stderr)
    emp = prune_weights(cfg, K.astype(np.float32), b, kstar.astype(np.float32), order, samples=40_000, key=12)
    bias = 2.0 * (2 * (H + F) + strength**2) / D
    assert np.all(np.abs(emp.risk - theory.risk) < 4.5 * emp.stderr[0] + bias), (emp.risk, theory.risk)
    # greedy on the weights (its own Monte Carlo estimates) starts from the same first choice
    # when the theory's best removal is clearly the best
    greedy_w = prune_weights(cfg, K.astype(np.float32), b, kstar.astype(np.float32), "greedy", samples=40_000, key=13,
                             loss="limit")
    assert np.all(np.abs(greedy_w.risk - theory.risk) < 0.02)


def test_one_draw_serves_every_subset(rng, orthogonal_spikes):
    """The held-out sequences are drawn once on the span of all H keys; a kept subset scored on
    them has the law of sequences drawn for the sub-layer alone (whose span and chi-square
    degrees of freedom differ): means within 4.5 combined standard errors and a two-sample
    Kolmogorov-Smirnov test, for the finite-D and the limit loss (a wrong renormalisation over
    the kept heads, e.g. bsoftmax keeping its factor H, changes the loss at O(1)). The shapes
    are those of test_theory_matches_weights, so the draw of the full layer is compiled once."""
    H, F, D, n = 4, 2, 1500, 40_000
    cfg = small_config("bsoftmax", H, F)
    M, Q, b = random_layer(rng, H, F)
    K, kstar = (x.astype(np.float32) for x in weights_with_overlaps(rng, M, Q, D, orthogonal_spikes))
    kept = [1, 3]
    for loss in ("empirical", "limit"):
        full = WeightsRisk(build(cfg, theory=False), K, b, kstar, samples=n, key=6, loss=loss).losses(kept)
        alone = WeightsRisk(build(cfg, theory=False), K[kept], b[kept], kstar, samples=n, key=7, loss=loss).losses([0, 1])
        se = np.hypot(full.std(ddof=1), alone.std(ddof=1)) / np.sqrt(n)
        assert abs(full.mean() - alone.mean()) < 4.5 * se, (loss, full.mean(), alone.mean(), se)
        assert stats.ks_2samp(full, alone).pvalue > 1e-3, loss


# -- CLI ----------------------------------------------------------------------------------


def test_cli_prune_integrate_output(tiny_run, tiny_pruning, capsys):
    """``prune`` of the session's tiny run (``integrate``'s files; two heads, one spike: the programs of
    tiny_pruning)."""
    out = tiny_run
    (out / "simulation.npz").unlink()  # the folder as integrate writes it
    assert main(["prune", str(out)]) == 0
    text = capsys.readouterr().out
    assert (out / "prune.png").stat().st_size > 0 and (out / "prune.npz").is_file()
    with np.load(out / "prune.npz") as d, np.load(out / "theory.npz") as th:
        assert d["theory_risks"].shape == (1, 2) and d["theory_removed"].shape == (1, 1)
        assert d["theory_risks"][0, 0] == pytest.approx(th["risk"][-1], abs=1e-10)  # unpruned = integrate's final risk
        np.testing.assert_allclose(d["theory_risks"][0], tiny_pruning.risks[0], rtol=0, atol=1e-12)
    assert "theory" in text and "H - F = 1" in text
    assert len([line for line in text.splitlines() if line.split()[:1] and line.split()[0].isdigit()]) == 2  # rows k = 0, 1
    assert main(["prune", str(out), "--order", "random", "--draws", "3", "--seed", "2"]) == 0
    capsys.readouterr()

    assert main(["prune", str(out), "--order", "biggest"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--order" in err and "greedy" in err
    assert main(["prune", str(out.parent / "missing")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["prune", str(out), "--source", "simulation"]) == 2
    assert "simulation.npz" in capsys.readouterr().err


def test_cli_prune_simulation_output(tmp_path, capsys, rng, tiny_pruning):
    """A folder as `simulate` writes it (config.json + simulation.npz of 2 seeds, float32): every
    seed is pruned through its final order parameters."""
    out = tmp_path / "sim"
    cfg = tiny()  # the shapes of tiny_pruning: its programs
    H, F = cfg.model.heads, cfg.problem.F
    Ms, Qs = zip(*(random_layer(rng, H, F)[:2] for _ in range(2)))
    T = 3
    save_run(out, cfg, {"simulation.npz": {
        "tau": np.arange(T, dtype=float), "M": np.repeat(np.stack(Ms)[:, None], T, 1).astype(np.float32),
        "Q": np.repeat(np.stack(Qs)[:, None], T, 1).astype(np.float32), "b": np.zeros((2, T, H), np.float32),
        "risk": np.zeros((2, T)), "risk_limit": np.zeros((2, T))}})
    assert main(["prune", str(out), "--order", "alignment"]) == 0
    text = capsys.readouterr().out
    assert "simulation (2 seeds" in text and "over seeds" in text
    assert (out / "prune.png").is_file()
    with np.load(out / "prune.npz") as d:
        assert d["simulation_risks"].shape == (2, H)
        for s in range(2):
            M, Q = (np.asarray(x, np.float32).astype(float) for x in (Ms[s], Qs[s]))
            assert d["simulation_risks"][s, 0] == pytest.approx(risk_with_heads(cfg, M, Q, np.zeros(H)), abs=1e-10)
            order = np.argsort(np.sqrt((M**2).sum(axis=1)))
            assert list(d["simulation_removed"][s]) == list(order[: H - 1])
