"""The parameters that mean one thing wherever a public callable takes them, each described once: the docs
build gives every callable that takes one and does not describe it in its own ``Args`` this sentence
(conf.py's ``describe_parameters``), and fails on a parameter described by neither
(``doc_tables.undescribed_parameters``). A name whose meaning depends on the callable is described in that
callable's docstring instead; a callable's own ``Args`` entry always wins over the glossary."""

_GLOBAL_BATCH = ("verl's global batch info, for a micro-batch of a larger mini-batch (``global_batch_info`` "
                 "computes it from the mini-batch's whole ``loss_mask``; ``GlobalBatch`` records it): ")

GLOSSARY: dict[str, str] = {
    # -- the policy losses (prm_jax.losses): AReaL's and verl's argument names --------------------------------
    "logprobs": ("``[B, T]`` log-probs of the sampled tokens on timesteps (``logprobs_on_timesteps``): in a "
                 "loss the current policy's, the one input the gradient flows through."),
    "proximal_logprobs": ("``[B, T]`` the log-probs the importance ratio is taken against (AReaL's proximal "
                          "policy, verl's ``old_log_prob``): ``AdvantageOutput.logprobs`` from "
                          "``compute_advantages``; no gradient flows through them."),
    "advantages": "``[B, T]`` per-timestep advantages (``AdvantageOutput.advantages``); no gradient flows through them.",
    "loss_mask": ("``[B, T]`` 1 on the trained timesteps and 0 elsewhere (``AdvantageOutput.loss_mask``); bool, "
                  "or a number that is 0 or 1 (checked)."),
    "rollout_is_weights": ("``[B, T]`` verl's optional per-token importance weights of the rollout, constants "
                           "that multiply each token's loss before aggregation; ``None``: none."),
    "loss_agg_mode": ("How per-token losses become one loss: ``token-mean``, ``token-sum``, ``seq-mean-token-sum``, "
                      "``seq-mean-token-sum-norm`` or ``seq-mean-token-mean`` (verl's ``agg_loss``; the guide "
                      "gives each formula)."),
    "loss_scale_factor": ("The divisor of ``seq-mean-token-sum-norm`` (verl's ``loss_scale_factor``); ``None``: "
                          "the padded width ``T``. Other modes ignore it."),
    "dp_size": _GLOBAL_BATCH + "the data-parallel ranks the loss is averaged over, >= 1 (default 1).",
    "batch_num_tokens": _GLOBAL_BATCH + "the mini-batch's trained tokens, the divisor of ``token-mean``; ``None``: "
                        "this call's own.",
    "global_batch_size": _GLOBAL_BATCH + "the mini-batch's rows, the divisor of the sequence modes; ``None``: this "
                         "call's own non-empty rows.",
    "clip_ratio_low": "The clip's lower margin: the ratio is clipped below at ``1 - clip_ratio_low`` (verl's name).",
    "clip_ratio_high": "The clip's upper margin: the ratio is clipped above at ``1 + clip_ratio_high`` (verl's name).",
    "clip_ratio_c": ("The dual clip's bound, > 1 (verl's ``clip_ratio_c``, default 3.0): for a negative advantage the "
                     "loss is capped at ``-A * clip_ratio_c``."),
    # -- the scorers' base arguments (every scorer takes them; a config entry sets them beside kwargs) -----------
    "weight": ("The scorer's weight: each of its scores is multiplied by it before the scorers' scores are summed "
               "into a turn's ``token_rewards`` (finite; 0 keeps the scorer's monitoring only)."),
    "enabled": "Whether the scorer scores (``False``: built and checked, never called).",
    "timeout": ("Seconds one call of the scorer may take before it fails its branch (a ``process`` call's worker is "
                "ended); ``None``: no deadline. A config entry's ``timeout`` sets it."),
    "max_concurrency": ("The most calls (for a served scorer: requests) in flight at once, >= 1, across every run "
                        "of the runner; ``None``: no bound."),
    "max_batch_size": "The most items one batched call takes, >= 1 (a batch is sent as soon as it is full).",
    "max_wait": ("Seconds, 0 to 60, a batched call waits for more items once its first arrives before it is sent "
                 "part-full."),
    "executor": ("Where a synchronous scorer's calls run: ``thread`` (blocking I/O, code that releases the GIL), "
                 "``process`` (CPU-bound Python: worker processes) or ``ray`` (actors on a Ray cluster); "
                 "``None``: the class's own."),
    "max_workers": ("Worker threads, processes or Ray actors, >= 1; ``None``: the cores for ``process``, "
                    "``min(32, cores + 4)`` threads, the cluster's CPUs for ``ray``."),
    "ray_address": "The Ray cluster to join (``executor: ray``; ``None``: a local Ray started for the run).",
    "num_cpus": "CPUs each Ray actor reserves (``executor: ray``), > 0; ``None``: Ray's default of 1.",
    "actor_options": "Further options of each Ray actor (``executor: ray``), passed to ``ray.remote`` as they are.",
    "placement_timeout": ("Seconds a Ray actor may wait for the cluster to place it before the scorer fails "
                          "(``executor: ray``); ``None``: 60."),
    "connect_timeout": "Seconds joining the Ray cluster may take before the scorer fails (``executor: ray``); ``None``: 30.",
    # -- the transport of served scorers and of call_with_retry ---------------------------------------------------
    "attempts": ("Attempts per call, >= 1: retried are 429, 408 and 5xx answers, connection errors and timeouts; any "
                 "other failure fails the call at once."),
    "backoff": ("Seconds, >= 0: the first retry waits a random time up to this (full jitter, doubling each retry, at "
                "most ``max_backoff``) unless the server sent ``Retry-After``."),
    "max_backoff": "Seconds, >= 0: the longest wait between two attempts.",
    "max_requests_per_second": ("Requests started per second, at most (>= 0.001; set it from the server's "
                                "published limit); ``None``: no bound."),
    # -- batches and rows -----------------------------------------------------------------------------------------
    "input_ids": "``[B, T]`` integer token ids of each row (prompt, generated tokens and tool outputs), padded.",
    "turn_ids": ("``[B, T]`` integer: each generated token's turn index within its row (0, 1, 2, ... in order), and "
                 "-1 on every token the policy did not generate (prompt, tool output, padding)."),
    "attention_mask": "``[B, T]`` 1 on a row's real tokens and 0 on padding; ``None``: every position is real.",
    "token_rewards": "Per-token process rewards: the summed, weighted scores of the scorers on each generated token.",
    "model_outputs": ("The per-token model outputs a batch carries besides the policy's log-probs (``prm_logprobs``, "
                      "``ref_logprobs``, ``teacher_logprobs``, ``sum_pi_squared``), by name; an empty tuple: none."),
    "is_eval": "Whether the run is an evaluation (scorers see it as ``ctx['is_eval']``; no training batch is built).",
    "runner": "The ``PRMRunner`` (open) whose scorers score the turns.",
    # -- the pipeline's declared records -------------------------------------------------------------------------
    "diagnostics": ("Whether (or, in a result, which) per-stage statistics are gathered (``diagnostics/...`` "
                    "means, minima and maxima of each stage's values)."),
    "checks": ("The value checks' counts, by name (``checks/...``: entries outside their declared range, "
               "non-finite outputs), device scalars; all 0 on a clean batch."),
    # -- the scorer contract's methods --------------------------------------------------------------------------
    "interaction": "The turn being scored (an ``Interaction``, read-only).",
    "interactions": "The branch's turns, root first (read-only).",
    "ctx": ("The scorers' context (read-only): the caller's keys, and ``messages``, ``is_eval`` and "
            "``metadata`` the runner adds; one mapping for every branch, or one per branch where several are scored."),
    "items": ("One call's items: ``(turn, ctx)`` pairs for a per-turn scorer, ``(turns, ctx)`` pairs (a branch, "
              "root first) for a trajectory scorer."),
    "where": "How errors name this call (the scorer and the turn, branch or batch).",
    "answer": "The server's answer, decoded from JSON.",
    "request": "The JSON body the scorer sent (its ``request(items)``).",
    "session_key": "The session's key.",
    "leaf_id": "The id of a branch's last turn.",
    "layout": ("What the scorer's ``layout(items)`` derived once for this call (a branch's tokens with its step "
               "tags), shared by ``request`` and ``read``; ``None``: derived here where needed."),
}
