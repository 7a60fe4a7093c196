"""Credit assignment beyond GAE, as jitted pure functions (the authors' code of each method (its repository and commit named
where it is used); issue 22). Each is also reachable
from configuration, so ``compute_advantages`` and ``prm-jax score`` run it:

- ``tree_discount``: AReaL's turn reward discount per tree (PR #1666's rule), no leak across branches;
- ``tree_advantages``: TreeRL's advantages over a group's session tree (``credit_assignment: {mode: tree}``);
- ``min_form``: PURE's min-form transform of per-turn process scores (``process_reward_transform:
  {mode: min_form}``), and the PURE recipe (``credit_assignment: {mode: pure}``);
- ``implicit_process_rewards``: PRIME's implicit process rewards (``credit_assignment: {mode: prime}``);
- ``decoupled_normalization``: GDPO's per-source group normalization (``reward_norm: {mode: decoupled}``);
- ``gigpo``: GiGPO (``credit_assignment: {mode: gigpo}``; its settings are ``prm_jax.config.GiGPOConfig``);
- ``distillation_rewards``: a teacher's log-probs of the student's tokens as a dense reward (on-policy
  distillation; its losses are ``prm_jax.losses``');
- ``optimal_token_baseline``: verl's optimal token baseline (its multi-turn rule), with ``sum_pi_squared``
  (``sum_v pi_v^2`` from logits) that it reads;
- ``reinforce_pp``: REINFORCE++ with its return carried across tool outputs, and its group-baseline variant
  (``credit_assignment: {mode: reinforce_pp}`` / ``{mode: reinforce_pp_baseline}``).

Empty inputs have one answer in every kernel, on every method: a batch of no rows or no timesteps (``B = 0``
or ``T = 0``; no nodes for the tree kernels) gives outputs of the shapes its inputs give, empty along the
empty axis, and 0 for a row with nothing in it (REINFORCE++ counts such a batch as degenerate); it is never
an error. ``sum_pi_squared`` refuses an empty vocabulary (``V = 0``: a distribution over no token).
"""

from prm_jax.kernels._distillation import distillation_rewards
from prm_jax.kernels._gigpo import GiGPOOutput, gigpo
from prm_jax.kernels._normalization import decoupled_normalization
from prm_jax.kernels._otb import OTBOutput, optimal_token_baseline, sum_pi_squared
from prm_jax.kernels._prime import implicit_process_rewards
from prm_jax.kernels._pure import min_form
from prm_jax.kernels._reinforce_pp import ReinforcePPOutput, reinforce_pp
from prm_jax.kernels._tree import TreeAdvantages, tree_advantages, tree_discount

__all__ = [
    "GiGPOOutput", "OTBOutput", "ReinforcePPOutput", "TreeAdvantages", "decoupled_normalization",
    "distillation_rewards", "gigpo", "implicit_process_rewards", "min_form", "optimal_token_baseline", "reinforce_pp",
    "sum_pi_squared", "tree_advantages", "tree_discount",
]
