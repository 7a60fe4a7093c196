"""The host-side group filters of AReaL's ``examples/swe/filter_function.py``, applied to a complete exported
group: ``export_group(..., group_filter=prm_jax.filters.filter_mixed_or_penalized_all_wrong)``. The code is
``prm_jax.runtime._group_filters``; this is its public namespace."""

from prm_jax.runtime._group_filters import (
    GroupFilterResult,
    filter_function,
    filter_mixed_or_penalized_all_wrong,
    filter_mixed_or_penalized_all_wrong_mask_no_eos,
    group_filter_flags,
)

__all__ = ["GroupFilterResult", "filter_function", "filter_mixed_or_penalized_all_wrong",
           "filter_mixed_or_penalized_all_wrong_mask_no_eos", "group_filter_flags"]
