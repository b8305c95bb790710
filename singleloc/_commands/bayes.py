"""``singleloc bayes CONFIG``: the Bayes risk of the config's problem (docs/model.md section 6)."""

from __future__ import annotations

import json

from ._common import add_config_arguments, config_from_args, int_at_least


def register(sub) -> None:
    p = sub.add_parser(
        "bayes",
        help="Bayes-optimal risk of the problem and, for discrete priors, the bsoftmax Bayes point",
        description="Print the Bayes risk E[(1 - p_eps)^2 + sum_{l != eps} p_l^2] of locating the "
        "relevant token for the [problem] of CONFIG (D -> infinity), with its numerical error: the "
        "standard error over --replicates independently scrambled Sobol rules of theory.points "
        "points (seeds theory.qmc_seed, +1, ...). For a discrete prior with K atoms it also "
        "prints the population risk of bsoftmax with H = K heads at the Bayes point "
        "(M_h = theta^(h), Q = M M^T, b_h = log pi_h - |theta^(h)|^2/2), which equals the Bayes "
        "risk, on independent scramblings (the next --replicates seeds). The [model] and [sgd] "
        "sections are not used.",
    )
    add_config_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--replicates", type=int_at_least(2), default=8, metavar="N",
                   help="independent scramblings for the error estimate (default 8, at least 2)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .._bayes import bayes_point, bayes_risk, check_bayes
    from .._population_risk import population_risk

    config = config_from_args(args)
    pb, th = config.problem, config.theory
    prior = pb.build_prior()
    check_bayes(prior, pb.L, th.points)  # both rules, before either risk is computed
    kw = dict(points=th.points, seed=th.qmc_seed, replicates=args.replicates)
    bayes = bayes_risk(prior, pb.L, **kw)
    point = None
    if prior.is_discrete:
        M, Q, b = bayes_point(prior)
        # independent scramblings (seeds after the Bayes risk's), so the two numbers are two checks
        risk = population_risk(prior, pb.L, "bsoftmax", M, Q, b, **{**kw, "seed": th.qmc_seed + args.replicates})
        point = {"activation": "bsoftmax", "heads": int(M.shape[0]), "M": M.tolist(), "Q": Q.tolist(), "b": b.tolist(),
                 "risk": risk.to_dict()}
    if args.json:
        out = {"problem": config.to_dict()["problem"], "prior": prior.name, "L": pb.L, "F": prior.F,
               "replicates": args.replicates, "bayes_risk": bayes.to_dict(), "bayes_point": point}
        print(json.dumps(out))
        return 0
    print(f"Bayes risk ({prior.name} prior, F = {prior.F}, L = {pb.L}): {bayes.value:.6f} +- {bayes.error:.1e} "
          f"(standard error over {args.replicates} scramblings of {th.points} Sobol points)")
    if point is not None:
        r = point["risk"]
        how = "exact route, error against a finer rule" if r["points"] == 0 else "independent scramblings"
        print(f"bsoftmax with H = K = {point['heads']} heads at the Bayes point: {r['value']:.6f} +- {r['error']:.1e} "
              f"(difference {r['value'] - bayes.value:+.1e}; {how})")
    else:
        print("no finite bsoftmax Bayes point: the prior has a Gaussian part")
    return 0
