"""The records the trainer passes around: its settings (`ABPOSettings`), one gathered rollout row of a generation
batch (`RolloutRecord`) and one logged example's candidate set to score (`CandidateSet`), each field named for
what it holds (no tuple read by position)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from abpo.algo.variants import Variant, get_variant
from abpo.config.policy import PolicyConfig
from abpo.config.update import UpdateConfig

REWARD_MODES = ("logged", "simulated_click")  # ABPOSettings.reward


def check_simulated_click_reward(settings: ABPOSettings, columns: Sequence[str]) -> None:
    """ABPOSettings.reward = simulated_click (the online upper bound) trains vanilla GRPO on the simulator's
    reward: each rollout's reward r_fmt + P(click | named candidate), nothing read from the logged feedback. So: the
    dataset has the column candidate_click_prob, and no term of the update reads y or the logged item (no anchor,
    self-certainty, no-response weight or logged-item term): those would mix the logged feedback back in. Raises
    ValueError naming the setting and the rule."""
    if settings.reward not in REWARD_MODES:
        raise ValueError(f"ABPOTrainer: reward={settings.reward!r}; rule: one of {list(REWARD_MODES)}")
    if settings.reward != "simulated_click":
        return
    v = get_variant(settings.variant)
    reads_y = [
        name
        for name, on in (
            (f"variant {v.letter} ({v.name})'s anchor", v.anchor),
            (f"variant {v.letter} ({v.name})'s self-certainty", v.self_certainty),
            (f"update.no_response_weight={settings.no_response_weight}", settings.no_response_weight != 1.0),
            ("update.no_response_weight_rule=click_rate", settings.no_response_weight_rule != "fixed"),
            (f"update.click_weight={settings.click_weight}", settings.click_weight != 1.0),
            ("update.likelihood_weight / update.offpolicy_weight", settings.anchor_terms),
        )
        if on
    ]
    if reads_y:
        raise ValueError(
            f"ABPOTrainer: reward=simulated_click with {', '.join(reads_y)}; rule: the simulator-rewarded update is "
            "vanilla GRPO (variant B, grpo) with the paper's settings, no term reading the logged feedback"
        )
    if "candidate_click_prob" not in columns:
        raise ValueError(
            "ABPOTrainer: reward=simulated_click but train_dataset lacks column candidate_click_prob; rule: each "
            "logged row carries the simulator's click probability of every candidate (abpo.sim.headroom)"
        )


# ABPOSettings' fields that are config keys, by section: each takes its default from that section's dataclass, and
# ABPOSettings.from_config copies them from the sections (the settings have no default of their own).
POLICY_KEYS = ("tau", "scoring_batch_tokens", "constrained_rollouts", "prompt_style")
UPDATE_KEYS = (
    "delta",
    "eps_std",
    "lambda_sc",
    "w_max",
    "ratio_level",
    "grpo_equal_samples",
    "self_certainty_positions",
    "no_response_weight",
    "no_response_weight_rule",
    "click_weight",
    "surrogate_weight",
    "likelihood_weight",
    "offpolicy_weight",
    "offpolicy_gamma",
)


@dataclass
class ABPOSettings:
    """The ABPO knobs the trainer needs on top of GRPOConfig: the keys of config sections ``update`` (the
    ABPO equations and the terms beside them) and ``policy`` (the scoring that e_old shares with the logging policy's e0)
    named in :data:`UPDATE_KEYS` and :data:`POLICY_KEYS`, with their config defaults and help
    (abpo.config.update.UpdateConfig, abpo.config.policy.PolicyConfig); built from a config by :meth:`from_config`.
    Beside them, what one update is: the variant, the click rate c of its logged rows and the reward mode."""

    variant: str = "abpo"
    delta: float = UpdateConfig.delta
    eps_std: float = UpdateConfig.eps_std
    lambda_sc: float = UpdateConfig.lambda_sc
    tau: float = PolicyConfig.tau  # the same temperature as the logging policy's e0
    w_max: float = UpdateConfig.w_max
    scoring_batch_tokens: int = PolicyConfig.scoring_batch_tokens
    constrained_rollouts: bool = PolicyConfig.constrained_rollouts  # rollouts only name candidates (Eq. q)
    ratio_level: str = UpdateConfig.ratio_level  # how s_i^j of step 5 is formed
    grpo_equal_samples: bool = UpdateConfig.grpo_equal_samples  # (B) samples G-1 rollouts like C-F
    prompt_style: str = PolicyConfig.prompt_style  # item_tokens scores e_old on the item token (abpo.policy.scoring)
    self_certainty_positions: str = UpdateConfig.self_certainty_positions  # the tokens r_sc averages over
    # the terms beside the paper's (docs/update-variants.md); the defaults are the paper's update
    no_response_weight: float = UpdateConfig.no_response_weight  # kappa (Eq. N1), or its scale under click_rate
    no_response_weight_rule: str = UpdateConfig.no_response_weight_rule  # fixed | click_rate (Eq. N2)
    click_weight: float = UpdateConfig.click_weight  # nu_1 (Eq. N1)
    click_rate: float | None = None  # c of the logged rows the update trains on (run_update sets it)
    surrogate_weight: float = UpdateConfig.surrogate_weight  # the step-5 term's weight
    likelihood_weight: float = UpdateConfig.likelihood_weight  # lambda_ll (Eq. L1)
    offpolicy_weight: float = UpdateConfig.offpolicy_weight  # lambda_off (Eq. O3)
    offpolicy_gamma: float = UpdateConfig.offpolicy_gamma  # gamma of f(x) = x / (x + gamma) (Eq. O2)
    # where the rollouts' r_match comes from: "logged" (the paper: the logged item and its feedback) or
    # "simulated_click" (the simulator's click probability of the named candidate, dataset column
    # candidate_click_prob: the online upper bound, a diagnostic no arm or config can select;
    # abpo.algo.rewards.simulated_click_reward)
    reward: str = "logged"

    @classmethod
    def from_config(
        cls, update: UpdateConfig, policy: PolicyConfig, variant: str, *, click_rate: float | None = None
    ) -> ABPOSettings:
        """The settings of ``variant``: every key of :data:`UPDATE_KEYS` from section ``update`` (with the variant's
        presets applied by the caller: abpo.train.grpo_args.settings_for) and of :data:`POLICY_KEYS` from ``policy``."""
        return cls(
            variant=variant,
            click_rate=click_rate,
            **{k: getattr(update, k) for k in UPDATE_KEYS},
            **{k: getattr(policy, k) for k in POLICY_KEYS},
        )

    def no_response_kappa(self) -> float:
        """kappa of Eq. N1 for these settings (abpo.algo.stratum_weight.no_response_weight)."""
        from abpo.algo.stratum_weight import no_response_weight

        return no_response_weight(self.no_response_weight_rule, self.no_response_weight, self.click_rate)

    @property
    def anchor_terms(self) -> bool:
        """Whether the logged item has a term of its own (Eq. L1 or O3): the trainer then scores its answer."""
        return self.likelihood_weight > 0 or self.offpolicy_weight > 0


def rollouts_per_example(variant: Variant | str, group_size: int, *, equal_samples: bool = False) -> int:
    """TRL num_generations: G - 1 sampled rollouts for anchored variants (the anchor a^1 = a^log is not sampled),
    G for vanilla GRPO (B), or G - 1 for B too when ``equal_samples`` (update.grpo_equal_samples: B and F then
    sample the same number of completions per logged example)."""
    v = get_variant(variant) if isinstance(variant, str) else variant
    k = group_size - 1 if (v.anchor or equal_samples) else group_size
    if k < 2:
        raise ValueError(
            f"update.group_size={group_size}: variant {v.letter} ({v.name}) would sample {k} rollout(s); "
            "rule: at least 2 rollouts per logged example (TRL needs num_generations >= 2)"
        )
    return k


class CandidateSet(NamedTuple):
    """One logged example's candidate set as the scorer reads it (e_old of docs/ABPO_SPEC.md "Propensities")."""

    prompt_ids: list[int]  # the rendered prompt's token ids (TRL's prompt_ids without padding)
    answers: Sequence[str]  # the well-formed answer text of each candidate (dataset column candidate_answers)
    candidates: Sequence[int]  # the candidate item ids C, in the dataset's order


class RolloutRecord(NamedTuple):
    """One rollout row of a generation batch as `ABPOTrainer._abpo_advantages` gathers it over the processes (a
    NamedTuple: it pickles through `accelerate.utils.gather_object`). The per-example fields repeat on each of the
    example's rollouts; a group is the num_generations consecutive records of one request."""

    request_id: str  # the logged example (dataset column request_id)
    y: int  # its feedback: 1 positive, 0 no response
    e0: float  # the logging propensity e0(a_log | q)
    r_sc: float  # this rollout's self-certainty r_sc (0.0 when not scored: y = 1 or a variant without it)
    e_old: float  # e_old(a_log | q) under the rollout policy pi_old (step 3's numerator)
    anchor_sc: float  # the anchor's r_sc (0.0 when not scored)
    chosen: int  # index into the row's candidates of the item this rollout named (-1: malformed)
    pi: list[float] | None  # e_old(. | q) over C, on the example's first row of this process only (else None)
    a_log_index: int  # index of a_log in the row's candidates
    popularity: float  # training interaction count of the chosen item (NaN when not scored or unknown)
    title_tokens: float  # token count of the chosen item's title (NaN when not scored)
    sim_click: float = float("nan")  # reward simulated_click: P(click | the chosen candidate) (0 if malformed)
