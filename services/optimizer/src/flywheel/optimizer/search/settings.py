"""The knobs of one search, with The Convergence's evolution defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from .scores import SEQUENTIAL

ALGORITHMS = ("mab_evolution", "genetic", "mab_only", "random")
RESTART_DESIGNS = ("random", "maximin", "local")


@dataclass(frozen=True)
class SearchSettings:
    """``algorithm``: ``mab_evolution`` (Thompson-sampled tournaments, surrogate-screened offspring,
    racing), ``genetic`` (plain GA: tournaments on the mean, no surrogate), ``mab_only`` (fresh random
    configs each generation, raced by Thompson sampling), ``random``.

    ``mutation_rate`` is the per-gene probability (one gene always mutates); ``mutation_scale`` the
    Gaussian sigma as a fraction of each numeric range. ``min_improvement`` is absolute, in score
    units. ``max_evaluations`` caps test-case evaluations (None: no cap). ``restart_after``: after
    that many generations without a gain in the current epoch the population is re-seeded from
    fresh configs, and breeding uses only candidates of the new epoch (None: never).

    Trust region (TuRBO-style, on the unit coordinates of the numeric parameters): offspring are
    kept inside a box around the current epoch's best candidate, of side ``trust_region_init``
    (scaled per parameter by the surrogate's lengthscales). ``trust_region_success`` generations
    in a row that improve on the epoch's best double the side (up to ``trust_region_max``);
    ``trust_region_failure`` generations in a row without a gain halve it (None: ceil(max(4,
    numeric parameters) / new candidates per generation)). Once the side falls below
    ``trust_region_min`` the epoch ends and the population restarts from fresh configs (a way out
    of a basin). ``trust_region_shape``: ``rotated`` (default) turns the box onto the principal
    axes of the epoch's best candidates, blended half and half with the lengthscale box (a
    CMA-like shape for rotated, ill-conditioned objectives); ``box`` keeps it axis-aligned.
    ``trust_region``: True, False, or None (auto: on when the surrogate is on and at
    least half of the parameters are continuous; a space of mostly categorical or listed values
    breeds without it).

    ``restart_design``: where a restarted epoch's population comes from. ``random`` (default):
    uniform fresh configs. ``maximin``: fresh configs picked greedily to be far (in the unit
    coordinates of the numeric parameters) from every config scored so far and from each other,
    so a restart explores basins not yet visited. ``local``: one such far point and a Gaussian
    cloud around it (sigma ``restart_sigma`` of each range), as IPOP-CMA-ES restarts a local
    search from a new random mean.

    ``racing_incumbent``: besides the race within the generation, every partly scored candidate
    is tested after each of its scores against the incumbent (the best candidate scored on every
    case so far, whatever its generation) on the cases they share, and dropped as soon as it is
    behind it with one-sided ``racing_incumbent_confidence`` (None: ``racing_confidence``), from
    ``racing_min_cases`` cases on, as Optuna's WilcoxonPruner races a trial against the best one.
    ``racing_revisit``: at each new generation, up to that many dropped, partly scored candidates
    whose posterior mean plus one standard deviation is above the incumbent's score re-enter the
    race (each at most once), starting one rung further on from the cases they have: a config
    dropped by an unlucky first few cases is not lost for good.

    ``racing_sequential``: the race tests a candidate again at every rung (3, 6, 12 cases with the
    defaults; after every case with ``racing_incumbent``), so with ``none`` (default) the chance
    that a candidate as good as the leader is dropped at some look exceeds ``1 - racing_confidence``.
    The other choices keep that chance within ``1 - racing_confidence`` over all the looks:
    ``bonferroni`` splits it evenly over the looks; ``spending`` spends it along an O'Brien-
    Fleming-type function of the cases seen (Lan-DeMets): little at the first rungs, where an
    unlucky streak of a few cases is likeliest, most at the last; ``mixture`` drops only when the
    paired mean is below zero by more than a normal-mixture confidence sequence's margin, valid
    at any number of looks (anytime), narrowest at the last scheduled look. ``racing_margin``
    (score units, default 0): the indifference zone; a candidate is dropped only when confidently
    behind the leader by more than it (every rule but the exact comparison of two candidates
    scored on every case)."""

    population_size: int = 20
    generations: int = 10
    mutation_rate: float = 0.2
    crossover_rate: float = 0.7
    elite_size: int = 2
    tournament_size: int | None = None
    mutation_scale: float = 0.1
    racing: bool = True
    racing_min_cases: int = 3
    racing_growth: float = 2.0
    racing_confidence: float = 0.9
    racing_incumbent: bool = False
    racing_incumbent_confidence: float | None = None
    racing_revisit: int = 0
    racing_sequential: str = "none"
    racing_margin: float = 0.0
    patience: int | None = None
    min_improvement: float = 0.0
    max_evaluations: int | None = None
    surrogate: bool = True
    surrogate_pool: int = 20
    surrogate_explore: float = 0.0
    surrogate_max_points: int = 150
    surrogate_gaussian: float = 0.5
    restart_after: int | None = None
    trust_region: bool | None = None
    trust_region_init: float = 0.8
    trust_region_min: float = 0.5**7
    trust_region_max: float = 1.6
    trust_region_success: int = 3
    trust_region_failure: int | None = None
    trust_region_shape: str = "rotated"
    trust_region_tol: float = 0.0
    restart_design: str = "random"
    restart_sigma: float = 0.2
    warm_start_fraction: float = 0.5
    algorithm: str = "mab_evolution"
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.population_size < 1:  # 1: one config per generation, as The Convergence allowed
            problems.append("population_size must be at least 1")
        if self.generations < 1:
            problems.append("generations must be at least 1")
        if not 0 <= self.elite_size < self.population_size:
            problems.append("elite_size must be in [0, population_size)")
        unit = ("mutation_rate", "crossover_rate", "warm_start_fraction", "surrogate_explore", "surrogate_gaussian")
        for name in unit:
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name} must be in [0, 1]")
        if not 0 < self.mutation_scale <= 1:
            problems.append("mutation_scale must be in (0, 1]")
        if self.racing_min_cases < 1 or self.racing_growth <= 1:
            problems.append("racing needs min_cases >= 1 and growth > 1")
        if not 0.5 < self.racing_confidence < 1:
            problems.append("racing_confidence must be in (0.5, 1)")
        if self.racing_incumbent_confidence is not None and not 0.5 < self.racing_incumbent_confidence < 1:
            problems.append("racing_incumbent_confidence must be in (0.5, 1) (or None: racing_confidence)")
        if self.racing_revisit < 0:
            problems.append("racing_revisit must be at least 0")
        if self.racing_sequential not in SEQUENTIAL:
            problems.append(f"racing_sequential must be one of {list(SEQUENTIAL)}")
        if not self.racing_margin >= 0:
            problems.append("racing_margin must be at least 0")
        if self.surrogate_max_points < 4:
            problems.append("surrogate_max_points must be at least 4")
        if self.algorithm not in ALGORITHMS:
            problems.append(f"algorithm must be one of {list(ALGORITHMS)}")
        if self.restart_after is not None and self.restart_after < 1:
            problems.append("restart_after must be at least 1 (or None: never restart)")
        if not 0 < self.trust_region_min <= self.trust_region_init <= self.trust_region_max:
            problems.append("trust region sides need 0 < trust_region_min <= trust_region_init <= trust_region_max")
        if self.trust_region_success < 1 or (self.trust_region_failure is not None and self.trust_region_failure < 1):
            problems.append("trust_region_success and trust_region_failure must be at least 1")
        if self.trust_region_shape not in ("box", "rotated"):
            problems.append("trust_region_shape must be 'box' or 'rotated'")
        if not 0 <= self.trust_region_tol < 1:
            problems.append("trust_region_tol must be in [0, 1)")
        if self.restart_design not in RESTART_DESIGNS:
            problems.append(f"restart_design must be one of {list(RESTART_DESIGNS)}")
        if not 0 < self.restart_sigma <= 1:
            problems.append("restart_sigma must be in (0, 1]")
        if self.max_evaluations is not None and self.max_evaluations < 1:
            problems.append("max_evaluations must be at least 1")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def tournament(self) -> int:
        return self.tournament_size or max(2, self.population_size // 4)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
