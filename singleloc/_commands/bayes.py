"""``singleloc bayes CONFIG``: the Bayes risk of the config's problem (docs/model.md section 6)."""

from __future__ import annotations

import json
import warnings

from ..ground._choices import REPLICATES_MAX
from ._common import add_config_arguments, config_from_args, int_at_least


def register(sub) -> None:
    p = sub.add_parser(
        "bayes",
        help="Bayes-optimal risk of the problem and, for discrete priors, the bsoftmax Bayes point",
        description="Print the Bayes risk E[(1 - p_eps)^2 + sum_{l != eps} p_l^2] of locating the "
        "relevant token for the [problem] of CONFIG (D -> infinity), with its numerical error, and an "
        "independent check. For a discrete prior with K atoms the Bayes estimator is bsoftmax with H = K "
        "heads at the Bayes point (M_h = theta^(h), Q = M M^T, b_h = log pi_h - |theta^(h)|^2/2): with "
        "theory.route = auto (default) its risk on the exact route (the Laplace form, any L; error against "
        "a finer rule) where that rule is affordable (up to four spikes, four binary or flipped atoms), "
        "checked against the closed-form posterior on --replicates independently scrambled Sobol rules of "
        "theory.points points (seeds theory.qmc_seed, +1, ...). Otherwise (a Gaussian part, more atoms, or "
        "theory.route = rule) the Sobol estimate with its standard error, checked for a discrete prior "
        "against the population risk of the Bayes point on the next --replicates seeds. The [model] and "
        "[sgd] sections are not used.",
    )
    add_config_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--replicates", type=int_at_least(2, REPLICATES_MAX), default=8, metavar="N",
                   help=f"independent scramblings for the error estimate (default 8, from 2 to {REPLICATES_MAX})")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..bayes._bayes import bayes_point, bayes_risk, bayes_route, check_bayes
    from ..bayes._population_risk import _check_rules, population_risk
    from ..expectations._routes import route_class
    from ..runtime._progress import Phase

    config = config_from_args(args)
    pb, th = config.problem, config.theory
    prior = pb.build_prior()
    route = bayes_route(prior, th.route)
    exact = route_class(route).refined_error  # the Bayes point's layer, its error against a finer rule
    unchecked = None  # why the exact route's independent check cannot run (the exact route takes any L)
    if th.points == "auto":
        raise ValueError("theory.points = 'auto' is chosen by integrate from the drift at the start; the Bayes risk's "
                         "Sobol rules need a number of points: e.g. theory.points = 4096")
    if exact:  # the check's rule over the L F spike fields, before anything is computed
        try:
            _check_rules(prior, pb.L, th.points, {"problem.F": (prior.F, False)})
        except (ValueError, MemoryError) as err:  # the reason without its remedy, which is for a run on the rule
            unchecked = f"its Sobol rule cannot be built here: {str(err).split('; e.g.')[0]}"
            if args.json:  # the text output says it in its own line
                warnings.warn(f"no independent check of the exact route: {unchecked}", stacklevel=1)
    else:
        check_bayes(prior, pb.L, th.points)  # both rules, before either risk is computed
    kw = dict(points=th.points, seed=th.qmc_seed, replicates=args.replicates)
    with Phase((f"computing the Bayes risk ({prior.name} prior, F = {prior.F}, L = {pb.L}, {route} route)",
                "computed the Bayes risk")):
        bayes = bayes_risk(prior, pb.L, **kw, route=route)
    point = check = None
    if prior.is_discrete:
        M, Q, b = bayes_point(prior)
        with Phase(("checking it on an independent route", "checked it")):
            if exact:  # the Bayes risk is this point's; the independent check: the posterior on the rule
                risk = bayes
                check = None if unchecked else {"what": "the closed-form posterior on the Sobol rule",
                                                "risk": bayes_risk(prior, pb.L, **kw, route="rule").to_dict()}
            else:  # independent scramblings (seeds after the Bayes risk's), so the two numbers are two checks
                risk = population_risk(prior, pb.L, "bsoftmax", M, Q, b, **{**kw, "seed": th.qmc_seed + args.replicates})
                check = {"what": f"bsoftmax with H = K = {int(M.shape[0])} heads at the Bayes point", "risk": risk.to_dict()}
        point = {"activation": "bsoftmax", "heads": int(M.shape[0]), "M": M.tolist(), "Q": Q.tolist(), "b": b.tolist(),
                 "risk": risk.to_dict()}
    if args.json:
        out = {"problem": config.to_dict()["problem"], "prior": prior.name, "L": pb.L, "F": prior.F,
               "replicates": args.replicates, "route": route, "bayes_risk": bayes.to_dict(), "check": check,
               "unchecked": unchecked,
               "bayes_point": point}
        print(json.dumps(out))
        return 0
    how = ("exact route: bsoftmax at the Bayes point, error against a finer rule" if exact else
           f"standard error over {args.replicates} scramblings of {th.points} Sobol points")
    print(f"Bayes risk ({prior.name} prior, F = {prior.F}, L = {pb.L}): {bayes.value:.6f} +- {bayes.error:.1e} ({how})")
    if check is not None:
        r = check["risk"]
        error = "error against a finer rule" if r["points"] == 0 else "independent scramblings"
        print(f"check, {check['what']}: {r['value']:.6f} +- {r['error']:.1e} (difference {r['value'] - bayes.value:+.1e}, "
              f"{abs(r['value'] - bayes.value) / max(r['error'], bayes.error):.1f} standard errors; {error})")
    elif unchecked:
        print(f"no independent check: {unchecked}")
    else:
        print("no finite bsoftmax Bayes point: the prior has a Gaussian part")
    return 0
