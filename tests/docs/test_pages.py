"""Issue 46.3: the built site's API pages, read as HTML (no browser). Run by ``python3 dev.py docs`` after the
build: every public callable's page lists its parameters and what it returns, and no table on the site has an
empty description cell (alabaster's site had 326)."""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "docs" / "_build" / "html"
sys.path.insert(0, str(ROOT / "docs"))


@pytest.fixture(scope="module", autouse=True)
def built_site():
    if not (SITE / "index.html").exists():
        pytest.fail("build the site first: python3 dev.py docs")


def public_callables():
    import conf

    for namespace, names in conf.public_names().items():
        module = importlib.import_module(f"prm_jax.{namespace}")
        for name in names:
            value = getattr(module, name)
            if not callable(value) or (inspect.isclass(value) and issubclass(value, enum.Enum)):
                continue  # (an enumeration's members are its values, not a call's parameters)
            try:
                parameters = [p for p in inspect.signature(value).parameters.values()
                              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            except (TypeError, ValueError):
                continue
            yield f"prm_jax.{namespace}.{name}", value, parameters


def test_every_public_callables_page_lists_its_parameters_and_what_it_returns():
    missing = []
    for path, value, parameters in public_callables():
        page = (SITE / "api" / "_generated" / f"{path}.html").read_text()
        article = page[page.index("<article"):page.index("</article>")]
        if parameters and "Parameters" not in article:
            missing.append(f"{path}: no parameter list")
        returns = not inspect.isclass(value) and inspect.signature(value).return_annotation is not inspect.Signature.empty
        if returns and not re.search(r"Return type|Returns", article):
            missing.append(f"{path}: no return type")
    assert missing == []


def test_no_table_on_the_site_has_an_empty_description_cell():
    empty = []
    for page in SITE.rglob("*.html"):
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", page.read_text(), re.S):
            cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
            if any(not re.sub(r"<[^>]+>|\s|&#160;|¶", "", cell) for cell in cells):
                empty.append(f"{page.relative_to(SITE)}: {re.sub(r'<[^>]+>', '', cells[0]).strip()[:60]}")
    assert empty == []


def test_no_signature_prints_a_long_default_or_value_whole():
    # Issue 57.10: signatures printed whole default reprs (18 lines over 300 characters; BATCH_SCHEMA's value
    # ran to 5,039, ExperimentConfig's signature to 873): a default whose repr runs past conf.LONG_DEFAULT is
    # shown by name (its type's), and a constant's or attribute's long value is left out.
    import conf

    long = []
    for page in (SITE / "api" / "_generated").glob("*.html"):
        for signature in re.findall(r'<dt class="sig sig-object py"[^>]*>(.*?)</dt>', page.read_text(), re.S):
            text = " ".join(re.sub(r"<[^>]+>", "", signature).replace("&#39;", "'").replace("&quot;", '"').split())
            depth, value, values = 0, None, []
            for ch in text:  # (each "= default", to the comma or the parenthesis that closes it)
                if value is not None and depth == 0 and ch in ",)":
                    values.append(value.strip())
                    value = None
                if ch in "([{":
                    depth += 1
                elif ch in ")]}":
                    depth -= 1
                if ch == "=" and depth <= 1 and value is None:
                    value, depth = "", 0
                elif value is not None:
                    value += ch
            if value is not None:
                values.append(value.strip())
            long += [f"{page.name}: {v[:80]}" for v in values if len(v) > conf.LONG_DEFAULT]
    assert long == []


def test_every_parameter_on_the_site_has_a_sentence():
    # Issue 57.6: 855 of 1,028 parameter entries had a type and no description. Every entry of a Parameters (or
    # Variables) list, a method's included, carries its sentence: "name (type) - what it is".
    from bs4 import BeautifulSoup

    bare = []
    for page in sorted((SITE / "api" / "_generated").glob("*.html")):
        soup = BeautifulSoup(page.read_text(), "html.parser")
        for entry in soup.select("dl.py"):
            owner = entry.find("dt").get("id", page.stem)
            for fields in entry.select(":scope > dd > dl.field-list"):
                for label in fields.select(":scope > dt"):
                    if label.get_text(strip=True).rstrip(":") not in ("Parameters", "Variables"):
                        continue
                    listed = label.find_next_sibling("dd")
                    for item in listed.select(":scope > ul > li") or [listed]:
                        text = item.get_text(" ", strip=True)
                        if "\u2013" not in text:  # (Sphinx writes "name (type) – sentence")
                            bare.append(f"{owner}: {text[:60]}")
    assert bare == []
