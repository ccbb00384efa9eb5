"""Batch search: Thompson sampling over a population, evolution, and racing across test cases.

The search is an ask/tell state machine. It never calls a model; the run orchestrator asks it
what to evaluate, has the evaluator run that, and tells it the scores::

    search = Search(space, test_case_ids, SearchSettings(...), prior=earlier_results)
    while not search.done:
        for candidate_id, config, case_id in search.next_evaluations(limit=8):
            ...                                   # queue the evaluation
        ...                                       # as results arrive:
        search.record(candidate_id, case_id, score)   # idempotent per (candidate, case)
    search.best()       # {"candidate_id", "config", "score", "cases", "complete", ...}
    search.history()    # generations and every candidate with its per-case scores

- ``next_evaluations(limit)`` returns up to ``limit`` (candidate_id, config, test_case_id)
  and marks them pending. It returns [] while the current rung waits for pending results,
  and once ``done``. Only ``record`` moves the search on.
- ``record(candidate_id, test_case_id, score)``: higher is better; the orchestrator folds the
  weighted metrics into this one number. A repeat of a recorded pair returns False and
  changes nothing, so a redelivered result is never counted twice.
- ``inject(configs)`` adds outside proposals (the society service) to the running
  generation; they are validated against the space and raced like the rest.
- ``to_state()`` / ``Search.from_state(state)``: JSON-serialisable, RNG included; a restored
  search given the same calls makes the same proposals. Pairs handed out before a crash stay
  pending: ``pending()`` lists them, ``requeue_pending()`` hands them out again.
- ``done`` with ``done_reason``: ``generations``, ``patience`` (no gain above
  ``min_improvement`` for ``patience`` generations) or ``budget`` (``max_evaluations``).

How a generation runs:

1. Every candidate is scored on a prefix of one shared random order of the test cases
   (paired comparisons). With racing it starts on ``racing_min_cases``; whenever nothing is
   pending, candidates confidently worse than the leader (a one-sided paired t-test at
   ``racing_confidence`` with the finite-population correction) are dropped and the
   survivors' prefixes grow by ``racing_growth``, until the survivors have every case.
2. Each candidate's posterior is its case-adjusted mean, shrunk toward the population;
   a candidate scored on every case is known exactly.
3. The next population keeps ``elite_size`` elites (best of the current epoch, fully scored:
   cached fitness, not re-evaluated). Offspring come from tournaments (size
   max(2, population/4)) on fresh Thompson draws, uniform crossover (``crossover_rate``), and
   per-gene mutation (``mutation_rate``): Gaussian at ``mutation_scale`` (10%) of the range in
   the unit (log where set) coordinate, snapped to ``step``; categorical genes are resampled.
   With ``surrogate`` on, ``surrogate_pool`` times more children are bred (some with finer
   mutation, a third and a tenth of the scale), joined by fresh configs from the whole space
   (``surrogate_explore``) and draws from a Gaussian fitted to the best candidates' numeric
   genes (``surrogate_gaussian``: follows the global trend, as CMA-ES's recombination does).
   A Gaussian process (ARD Matern 5/2 on the unit cube, hyperparameters by maximum marginal
   likelihood, rank-warped scores, each candidate's racing uncertainty as its own noise) then
   picks the offspring by batch Thompson sampling: joint posterior draws over the whole pool,
   one pick per draw. It learns from at most ``surrogate_max_points`` candidates (the best
   half and the most recent), so its cost stays flat as the history grows.
4. Trust region (TuRBO-style; on by default when at least half of the parameters are
   continuous, see ``SearchSettings.trust_region``): the pool's numeric genes are clipped into
   a box around the epoch's best candidate, stretched per parameter by the GP's lengthscales,
   and joined by perturbations of that candidate inside the box. Generations that improve on
   the epoch's best in a row double the box; generations without a gain halve it; once it is
   smaller than ``trust_region_min`` the epoch ends and a fresh population starts a new one
   (the old results stay in ``best()`` and in the GP's data, but no longer breed). This keeps
   the population from collapsing onto one basin for good.
5. Warm start: ``prior`` results from earlier runs on the same space (see
   ``SearchSpace.fingerprint``) seed part of the first population (``warm_start_fraction``,
   best first) and inform the surrogate.
"""

from .engine import Candidate, Search
from .settings import ALGORITHMS, SearchSettings
from .space import CATEGORICAL, CONTINUOUS, DISCRETE, Param, SearchSpace

__all__ = [
    "ALGORITHMS",
    "CATEGORICAL",
    "CONTINUOUS",
    "DISCRETE",
    "Candidate",
    "Param",
    "Search",
    "SearchSettings",
    "SearchSpace",
]
