import numpy as np

from prm_jax import demo

import reference


def test_demo_prints_every_mode_and_matches_the_reference(capsys):
    results = demo.run()
    printed = capsys.readouterr().out
    for column in ("additive", "gvpo", "process_weighted", "returns"):
        assert column in printed
    batch, names = demo.load_demo_batch()
    assert all(name in printed for name in names)
    norm = dict(mean_level="batch", std_level="batch")
    for mode in ("additive", "process_weighted"):
        want = reference.compute_advantages(batch, dict(kl_ctl=0.0, adv_norm=norm, shaping=dict(mode=mode)))
        np.testing.assert_allclose(results[mode], want["advantages"], rtol=1e-5, atol=1e-5)
    # The over-budget turn of row 0 (P = 0) loses its positive advantage under process_weighted and gvpo.
    over_budget = results["m"][0] * (results["P"][0] == 0) > 0
    assert over_budget.any() and (results["none"][0][over_budget] > 0).all()
    assert (results["process_weighted"][0][over_budget] == 0).all()
    assert (results["gvpo"][0][over_budget] == 0).all()
