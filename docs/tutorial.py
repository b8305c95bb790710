# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Tutorial
#
# A tour of `singleloc` in six steps, each a few lines of the public API: the theory (an ODE for the order
# parameters) against finite-$D$ SGD, heads that specialize, the escape rate of the unspecialized point, the
# Bayes risk, pruning a trained layer, and the diagnostics of an attention array. Every step runs on the
# default route (`theory.route = "auto"`: the exact expectations for softmax-family activations) except
# step 5, which says why. The whole script ran in 105 s (108 s of CPU time) on a 2-core CPU at a load
# average of 2-3; the outputs on this page were made at a load of 1.6, in 70 s (107 s of CPU time; some of
# the package's stored programs already compiled by earlier runs). Most of it is JAX compiling each new
# problem once (a script keeps its compiled programs for the next run only if it calls
# `sl.enable_compilation_cache()`, as the commands do).
#
# Run it as a script, `python docs/tutorial.py` (CI does, so it never goes stale), or open it as a
# notebook: it is a [jupytext](https://jupytext.readthedocs.io) percent script, so `jupytext --to ipynb
# docs/tutorial.py` (or Jupyter with the jupytext extension) turns it into one, and each figure shows below
# its cell. [Download the script](tutorial.py). On this page every cell is followed by what it printed and
# drew when the script last ran (`python docs/_run_tutorial.py` keeps them). The mathematics behind each
# step is in [the model](model.md).

# %%
import time

import jax

jax.config.update("jax_enable_x64", True)  # the ODE in double precision (simulations stay in float32)

import numpy as np  # noqa: E402

import singleloc as sl  # noqa: E402
from singleloc import plots  # noqa: E402  (figures: matplotlib Figure objects, no global state)

start, cpu = time.time(), time.process_time()  # wall and CPU seconds (the CPU time of all threads)

# %% [markdown]
# ## 1. The default problem: theory against simulation
#
# A configuration is a preset plus `section.key=value` overrides (see [the commands](commands/index.md)).
# The default problem is softmax attention with $H = 2$ heads, $L = 4$ tokens and $F = 2$ spikes of strength
# 2.5. We simulate online SGD at a small dimension $D = 500$ for two seeds, then integrate the
# $D \to \infty$ ODE once per seed, started from that seed's own initial overlaps and read at the same times.

# %%
config = sl.load_config("default", ["simulation.D=500", "simulation.seeds=2", "sgd.tau_max=10", "sgd.n_save=21"])
simulation = sl.simulate(config, progress=False)
theory = sl.integrate(config, sl.initial_conditions(config), ts=simulation.tau, progress=False)

print("risk at tau = 0 and 10, simulation:", simulation.risk.mean(0)[[0, -1]].round(4),
      " theory:", theory.risk.mean(0)[[0, -1]].round(4))
print(f"largest |risk_sim - risk_theory| = {np.abs(simulation.risk - theory.risk).max():.4f}, "
      f"largest |M_sim - M_theory| = {np.abs(simulation.M - theory.M).max():.4f}")

# %% [markdown]
# The risk falls from about 0.78 to 0.38 in both, and they agree to within the finite-$D$ fluctuations, of
# order $D^{-1/2} \approx 0.045$ here, and the Monte Carlo error of the test risk ($4096$ fresh sequences per
# saved time): both largest deviations come out between 0.01 and 0.03. The figure shows the risk, the
# head-spike overlaps $M_{hf}$ and the cosine of each head with its spike: lines and bands for the theory
# (its mean over the seeds and their spread), circles and bars for the simulations; the heads of every run
# are matched to the spike they lean to. Up to $\tau = 10$ both heads lie along the mean of the spikes
# (cosine $1/\sqrt 2$): softmax heads specialize much later ([phases](phases.md)). A `plots` function
# returns a matplotlib `Figure`, which a notebook shows; `fig.savefig(...)` writes it.

# %%
plots.plot_compare(theory, simulation, title="default problem, D = 500")

# %% [markdown]
# ## 2. Heads specialize
#
# With bsoftmax (normalised across heads as well as tokens), trained biases, spikes of strength 3 and
# learning rate 1, the two heads first share one profile along the mean direction of the signal (a
# plateau of the risk), then escape it and specialize, one head per spike. `analyze` reads these phases off
# a trajectory; a smaller quadrature rule (`theory.points`) is enough here and compiles faster.

# %%
bconfig = sl.load_config("bsoftmax", ["problem.strength=3", "sgd.lr=1", "sgd.tau_max=30", "sgd.n_save=61",
                                      "theory.points=1024"])
prior = bconfig.problem.build_prior()
trajectory = sl.integrate(bconfig, progress=False)  # one start: the overlaps of seed 0 at D = 1000
phases = sl.analyze(trajectory.tau, trajectory.M, trajectory.Q, trajectory.risk, mean=prior.mean())

print(f"plateau risk {phases.plateaus[0][0].risk:.3f}, escape at tau = {phases.escape_time[0]:.1f}, "
      f"heads specialized at tau = {phases.specialization_times[0]}, final risk {phases.final_risk[0]:.3f}")

# %% [markdown]
# The risk sits on a plateau near 0.26, escapes at $\tau \approx 16$, and the two heads specialize at
# $\tau = 17.5$ and $22.5$ (one spike each), reaching 0.13 by $\tau = 30$. The warning is the exact
# route's statement about its one approximate part, the $\mathrm{lr}^2$ (Gram) term on a Sobol rule: a
# relative error of 1e-2 in that term moves a final risk by about 1e-4 here; `theory.replicates = 2` would
# measure it ([how the theory is computed](theory_route.md)).

# %%
plots.plot_phases(phases, trajectory.risk, title="bsoftmax, H = F = 2")

# %% [markdown]
# ## 3. The escape rate
#
# The plateau is the neighbourhood of the *unspecialized* fixed point, where all heads are alike. Linearising
# the ODE there (`jax.jacobian` of the drift) gives its unstable modes; the escape rate $\lambda$ is the
# largest rate among those that break the head symmetry. The symmetry-breaking part of the overlaps starts at
# $O(D^{-1/2})$ and grows like $e^{\lambda \tau}$, so the escape time grows like $\log(D) / (2\lambda)$
# ([model, section 5.9](model.md#59-phases-linear-stability-and-the-log-d-law)).

# %%
ode = sl.OrderParameterODE.from_setup(sl.build(bconfig))
H, F = bconfig.model.heads, bconfig.problem.F
point = sl.unspecialized_point(ode, H, F, init_scale=bconfig.sgd.init_scale, dt=0.5)  # Tsit5 steps of 0.5 (default 0.1)
rate = sl.escape_rate(sl.linearize(ode, point.M, point.Q, point.b), mean=prior.mean())
print(f"unspecialized point: M_h = {point.M[0].round(3)}, risk {point.risk:.3f}, converged: {point.converged}")
print(f"escape rate lambda = {rate:.3f}: d tau_esc / d log D = {sl.predicted_escape_slope(rate):.2f}")

# %% [markdown]
# The fixed point is found by following the head-symmetric flow and polishing its end with a root finder;
# `dt=0.5` follows the flow in Tsit5 steps of 0.5 instead of the default 0.1, five times fewer drift
# evaluations (the flow is smooth: halving the step moves its states at $\tau$ = 5, 10, 20, 40 and 60 by
# at most 3e-8, and the rate at the point agrees with the default step's to 1e-14). Here $\lambda = 0.180$,
# so every factor $e$ in $D$ would delay the escape by about 2.8. With this prior, though, the plateau creeps
# towards its fixed point without reaching it at these times, and the rate along the way
# (`escape_rate_along`, on the symmetric trajectory that led to the point) is larger than at the point
# itself, 0.42 at $\tau = 5$ falling to 0.26 at $\tau = 40$: the heads leave earlier than $\lambda$ alone
# predicts. [Specialization phases](phases.md) measures both regimes.

# %%
when = np.searchsorted(point.path_tau, [5.0, 10.0, 20.0, 40.0])
along = sl.escape_rate_along(ode, point.path_tau[when], point.path_x[when], H, F, mean=prior.mean())
print("rate along the symmetric flow at tau = 5, 10, 20, 40:", along.round(3))

# %% [markdown]
# ## 4. The Bayes risk
#
# The best any estimator of the location can do is the Bayes risk of the problem, computed with its own
# quadrature error ([model, section 6](model.md#6-bayes-optimal-baseline)). For a discrete prior with $K$
# atoms, bsoftmax with $H = K$ heads can represent the Bayes estimator: at its Bayes point its risk equals the
# Bayes risk.

# %%
L = bconfig.problem.L
bayes = sl.bayes_risk(prior, L)
M_b, Q_b, b_b = sl.bayes_point(prior)
at_point = sl.population_risk(prior, L, "bsoftmax", M_b, Q_b, b_b)
print(f"Bayes risk {bayes.value:.4f} +- {bayes.error:.1e}; bsoftmax at its Bayes point {at_point.value:.4f}")
gap = trajectory.risk[0, -1] - bayes.value
print(f"the trained layer of step 2 at tau = 30: {trajectory.risk[0, -1]:.4f} ({gap:+.4f} above Bayes)")

# %% [markdown]
# The Bayes risk is 0.104, and the bsoftmax layer at its Bayes point matches it within the quadrature error.
# The layer trained in step 2 is still 0.03 above it at $\tau = 30$: its risk keeps creeping down, and
# online SGD at a finite learning rate keeps a small gap of order `lr` ([Bayes baseline](bayes.md)).

# %% [markdown]
# ## 5. Pruning a trained layer
#
# Train a layer with more heads than spikes, $H = 4$, then remove heads one at a time, greedily (the head
# whose removal raises the risk least), scoring each pruned layer by its population risk
# ([model, section 7](model.md#7-pruning)). This is the one step off the default route. A bsoftmax layer
# normalises across its heads, so its exact expectations are joint over all of them and their cost grows like
# a power of $H$: on the 2-core CPU of this page the exact trajectory of three such heads took 2.5 minutes of
# CPU time to solve, four take longer still. The Sobol rule (`theory.route = "rule"`, 1024 points as in
# step 2) takes seconds ([how the theory is computed](theory_route.md)).

# %%
wide = bconfig.replace(model={"heads": 4}, theory={"route": "rule"})  # see below
trained = sl.integrate(wide, progress=False)
M, Q, b = trained.M[0, -1], trained.Q[0, -1], trained.b[0, -1]
pruned = sl.prune_theory(wide, M, Q, b, "greedy")
print("risk after removing 0, 1, 2, 3 heads:", pruned.risk.round(4), " removed, in order:", pruned.removed[0])
print(f"{pruned.removable(0.01)} heads can go before the risk rises by 0.01 (H - F = {4 - F})")
print(trained.quadrature())

# %% [markdown]
# The risk after removing 0, 1, 2, 3 heads is about 0.128, 0.129, 0.126, 0.53: the two surplus heads can go
# (the risk moves by less than 0.002; at $\tau = 30$ they were still mixed over the spikes), and the third
# removal leaves one spike without a head. One Sobol rule states no error of its own (the quadrature line
# says so); `theory.replicates = 2` measures it: tried once, the risks moved by up to 0.009 and their stated
# standard errors were up to 3e-3, the same two heads could go and the third removal still cost 0.39.

# %%
plots.plot_pruning({"greedy, theory": pruned}, F=F, title="bsoftmax, H = 4, F = 2")

# %% [markdown]
# ## 6. Diagnosing an attention array
#
# The normalization diagnostics ([model, section 8](model.md#8-normalization-limits-second-source-paper))
# work on attention weights from any model: the last axis runs over the tokens of a row, the one before over
# queries, the others over heads (GPT-2: `(layers, heads, L, L)`). Softmax rows whose logits stay in
# $[-a, a]$ must spread out as $L$ grows: `vanishing_attention` compares every row with the bounds
# $e^{-2a}/L \le \alpha_i \le e^{2a}/L$.

# %%
rng = np.random.default_rng(0)
for n in (16, 128, 1024):
    logits = rng.uniform(-1.0, 1.0, size=(64, n))  # 64 rows of n tokens, logits in [-1, 1]
    rows = sl.vanishing_attention(logits=logits)
    print(f"L = {n:5d}: largest weight {rows.max_weight.mean():.4f}, L * largest weight "
          f"{rows.max_scaled.mean():.2f} (bound e^2 = {np.exp(2):.2f}), bounds hold: {rows.holds.all()}")

# %% [markdown]
# The largest weight falls like $1/L$ (0.13, 0.018, 0.0023) while $L$ times it stays near 2.3, under the
# bound $e^{2} \approx 7.4$: no token can hold on to its weight unless the logits grow like $\log L$.

# %% [markdown]
# `diagnose_attention` runs every diagnostic on a whole array, as [`singleloc diagnose`](commands/diagnose.md)
# does: here two layers of four causal heads with 128 tokens, and random token vectors for the top-$N$
# diagnostics, whose critical top-$N$ is where selecting more tokens stops separating the context from the
# rest (the samples of its test are the eight heads).

# %%
logits = 2.0 * rng.normal(size=(2, 4, 128, 128))
logits = np.where(np.tri(128, dtype=bool), logits, -np.inf)  # causal: query q sees tokens 0..q
weights = np.exp(logits - logits.max(-1, keepdims=True))
weights /= weights.sum(-1, keepdims=True)
values = rng.normal(size=(2, 4, 128, 16))  # one set of token vectors per head
diagnosis = sl.diagnose_attention(weights, values)
print(diagnosis.table())

# %%
plots.plot_vanishing(diagnosis)

# %%
print(f"tutorial ran in {time.time() - start:.0f} s ({time.process_time() - cpu:.0f} s CPU)")
