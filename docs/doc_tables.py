"""The tables the guides include (``{include} <name>.inc``), each rendered at every docs build from the code's
own declarations, never pasted: conf.py calls ``write``; tests/test_doc_tables.py holds each include to its
source. The ``.inc`` files are build outputs (ignored by git)."""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: The public namespaces of ``prm_jax`` (each an ``__all__``): the API pages (conf.py), the public-API table,
#: the boundary tests (tests/test_public_api.py).
NAMESPACES = ("config", "kernels", "kernels.gae_lambda", "runtime", "credit", "estimators", "losses", "filters",
              "scorers", "errors")
#: Public modules that are not namespaces of names, in the public-API table too (the tunix integration has its
#: own guide: its learners need the tunix extra).
DOCUMENTED_MODULES = ("app.sessions",)
SOURCES = Path(__file__).resolve().parent.parent / "prm_jax"
SHORT = 120  # the most characters of a name's line in the public-API table


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]], *, linked: str = "") -> str:
    """A Markdown table: the first cell of each row as code (``linked``: a module whose object the cell names,
    linked to its page in the API reference), ``|`` escaped in the others."""
    cell = lambda text: text.replace("|", "\\|")
    first = (lambda name: f"{{py:obj}}`~{linked}.{name}`") if linked else (lambda name: f"`{name}`")
    return "\n".join(["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
                      *("| " + " | ".join([first(row[0]), *map(cell, row[1:])]) + " |" for row in rows)])


def errors() -> str:
    from prm_jax.errors import described

    return markdown(("error", "also a", "raised when", "on the command line"), described())


def session_format() -> str:
    from prm_jax.app.sessions import format_table

    return markdown(("key", "", "JSON type", "values", "what it is", "in the batch"), format_table())


def refusals() -> str:
    from prm_jax.config import refusals_markdown

    return refusals_markdown()


def public_api() -> str:
    """Each public namespace (and documented module): its first sentence, then one short line a name, the
    first sentence of the name's docstring (a constant's ``#:`` comment). A name without one is an error:
    the docs build fails, naming it."""
    sections = []
    for namespace in (*NAMESPACES, *DOCUMENTED_MODULES):
        module = importlib.import_module(f"prm_jax.{namespace}")
        rows = [(name, summary(f"prm_jax.{namespace}.{name}", getattr(module, name))) for name in module.__all__]
        linked = f"prm_jax.{namespace}" if namespace in NAMESPACES else ""  # (the API reference's pages)
        sections.append(f"## `prm_jax.{namespace}`\n\n{short_line(inspect.getdoc(module) or '')}\n\n"
                        + markdown(("name", "what it is"), rows, linked=linked))
    return "\n\n".join(sections)


def summary(path: str, obj: Any) -> str:
    """The short line of the public name ``path``: its docstring's first sentence (``short_line``), or for a
    constant or a type alias, the ``#:`` comment above its assignment in the package's sources."""
    own = callable(obj) and str(getattr(obj, "__module__", "")).startswith("prm_jax")  # (jitted ones too)
    text = (inspect.getdoc(obj) or "") if own else attribute_doc(path.rsplit(".", 1)[1])
    if not text.strip():
        raise ValueError(f"{path} has no description (a docstring, or a '#:' comment above a constant)")
    return short_line(text)


def attribute_doc(name: str) -> str:
    """The ``#:`` comment of the top-level assignment of ``name`` in the package's sources (``alias_docs``)."""
    return alias_docs().get(name, "")


@functools.cache
def alias_docs() -> dict[str, str]:
    """Every name given a ``#:`` documentation comment at a module's top level in the package (constants, and
    type aliases such as ``ErrorPolicy``: a ``Literal`` has no docstring of its own), with the comment's text:
    the comment lines right above ``name = ...`` or ``name: type = ...``, as Sphinx reads them."""
    found: dict[str, str] = {}
    for source in sorted(SOURCES.rglob("*.py")):
        lines = source.read_text().splitlines()
        for k, line in enumerate(lines):
            match = re.match(r"([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)", line)
            if not match or k == 0 or not lines[k - 1].startswith("#:"):
                continue
            start = k
            while start > 0 and lines[start - 1].startswith("#:"):
                start -= 1
            found.setdefault(match.group(1), " ".join(text[2:].strip() for text in lines[start:k]).strip())
    return found


def short_line(text: str) -> str:
    """A docstring's first sentence as one Markdown line of at most ``SHORT`` characters (cut at a word
    boundary, with an ellipsis), reStructuredText's double backticks as Markdown's."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split()).replace("``", "`")
    match = re.match(r"(.+?[.!?])(?:\s|$)", paragraph)
    line = match.group(1) if match else paragraph
    if len(line) > SHORT:
        line = line[:SHORT - 2].rsplit(" ", 1)[0].rstrip(",;:(") + " …"
    if line.count("`") % 2:  # (a cut inside code: close it)
        line = line[:-2] + "` …" if line.endswith(" …") else line + "`"
    return line


def steps() -> str:
    """The credit-assignment guide's table of ``compute_advantages``' steps: what each stage may be (the modes
    of the declared stages and the registered estimators) and the batch keys it reads (their declarations)."""
    from prm_jax.estimators import STAGE_SPECS, registered

    def modes(kind: str) -> list[Any]:
        return [spec for spec in STAGE_SPECS if spec.kind == kind]

    def keys(specs: Sequence[Any], *first: str) -> str:
        readers: dict[str, list[str]] = {key: [] for key in first}
        for spec in specs:
            for key in (*spec.reads, *getattr(spec, "may_read", ())):
                readers.setdefault(key, []).append(spec.mode)
        return ", ".join(f"`{key}`" + (f" ({', '.join(who)})" if who else "") for key, who in readers.items())

    def listed(specs: Sequence[Any]) -> str:
        return ", ".join(f"`{spec.mode}`" for spec in specs)

    credit = [spec for spec in registered() if spec.mode is not None]
    after = [spec for spec in credit if spec.kl == "after"]
    summed = [spec for spec in credit if spec.kl == "rewards"]
    owners = [spec for spec in credit if spec.owns_process_rewards]
    rows = [
        ("1", "outcome reward", "overlong penalty, bias, scaling, clip (`reward_clip`, AReaL's 20 by default: the "
         "row's whole outcome reward, a sum of reward functions included, is clipped to `+-20` after bias and "
         "scaling; verl clips nothing, so a summed reward above 20 surprises there); then `reward_norm`: "
         f"{listed(modes('reward_norm'))} (`normalize`: AReaL's `NormConfig`; `decoupled`: GDPO over the outcome "
         "and `reward_sources [B, K]`)", keys(modes("reward_norm"), "rewards")),
        ("2", "timesteps", "the rollout's arrays shifted onto next-token timesteps; the old log-probs are "
         "`prox_logprobs` where given, else the shifted `logprobs`; `P` is the shifted `token_rewards`",
         "`loss_mask`, `attention_mask`, `logprobs`, `prox_logprobs`, `values`, `token_rewards`"),
        ("3", "process rewards `P`", f"`process_reward_transform`: {listed(modes('process_reward_transform'))}",
         keys(modes("process_reward_transform"), "turn_ids")),
        ("4", "KL rewards", "the KL estimate (`kl_estimator`) clamped to `+-kl_clamp` (AReaL's 10; tunix uses 5) "
         "before `-kl_ctl` scales it", "`ref_logprobs`"),
        ("5", "where the outcome and `P` go", "the outcome reward at the last trained timestep (0 on truncated rows "
         "under `mask_no_eos_with_zero`); `P` kept for shaping (`token_rewards_as_adv: true`) or folded into the "
         "rewards", "`is_truncated`"),
        ("6-7", "advantages and returns", "GAE (`gae_timestep_unit: token \\| turn`), or `credit_assignment`: "
         f"{listed(after)} (each replaces GAE; the KL rewards are added to its advantages), {listed(summed)} (the "
         "KL rewards in the rewards they sum)", keys(credit)),
        ("8", "`adv_norm`", "AReaL's `NormConfig` over the advantages on the trained timesteps",
         "(the advantages of step 7)" + (f"; {keys(modes('adv_norm'))}" if any(s.reads for s in modes("adv_norm"))
                                         else "")),
        ("9", "shaping", f"`advantage_shaping` with `P`: {listed(modes('advantage_shaping'))}"
         + (f"; not under {listed(owners)} (its returns already hold `P`)" if owners else ""),
         "(the advantages of step 8, `P` of step 5)"),
    ]
    return "\n".join(["| step | stage | choices | batch keys it reads |", "| --- | --- | --- | --- |",
                      *(f"| {' | '.join(row)} |" for row in rows)])


# Each include of the guides, and what renders it.
TABLES: dict[str, Callable[[], str]] = {"errors-table.inc": errors, "session-format-table.inc": session_format,
                                        "refusals-table.inc": refusals, "public-api-table.inc": public_api,
                                        "steps-table.inc": steps}


def write(folder: Path) -> None:
    """Each of ``TABLES`` into ``folder`` (rewritten only where its text changed)."""
    for name, render in TABLES.items():
        page, text = folder / name, render() + "\n"
        if not page.exists() or page.read_text() != text:
            page.write_text(text)
