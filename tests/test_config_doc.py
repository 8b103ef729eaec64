"""`docs/configuration.md` is the configuration reference generated from the settings models; this test checks it
is current, or rewrites it with `UPDATE_CONFIG_DOC=1`."""

import os
from pathlib import Path

from unstable.config.reference import reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_configuration_reference_is_current():
    text = reference()
    if os.environ.get("UPDATE_CONFIG_DOC"):
        DOC.write_text(text)
    assert DOC.exists() and DOC.read_text() == text, (
        "docs/configuration.md is stale: UPDATE_CONFIG_DOC=1 PYTHONPATH=src python -m pytest tests/test_config_doc.py"
    )


def test_every_setting_has_a_row():
    text = reference()
    for section in ("run", "model", "inference", "collector", "pool", "buffer", "learner", "tracker", "warm_start"):
        assert f"## `{section}`" in text
    assert "| `initial_lora_path` |" in text and "| `env_id` |" in text and "| `keep_steps` |" in text


def test_each_section_keeps_its_whole_description():
    """A section's description is its model's first docstring paragraph whole (it was cut to the first line, and four
    sections ended mid-sentence)."""
    from unstable.learner.config import RetentionConfig

    paragraph = " ".join(RetentionConfig.__doc__.strip().split("\n\n")[0].split())
    assert f"## `learner.retention`\n\n{paragraph}\n" in reference()
    sections = reference().split("\n## ")[1:]
    for section in sections:
        summary = section.split("\n\n")[1]
        assert summary.rstrip().endswith((".", ":", ")")), f"a description cut mid-sentence: {summary!r}"
