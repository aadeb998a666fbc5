"""Builds the qwen3_omni family's directory: a release, and the parts derived from it.

Layout under `<models_dir>/qwen3_omni/`: release/ (the tiny random release, when no real one is
given: `release.write_tiny_release`), thinker_lm/ (the thinker's language model as a plain
Qwen3MoeForCausalLM for stock vLLM: `thinker_lm`), talker_lm/ (the talker's language model, the
same class with its gated shared expert, served by vLLM as a pooling model: `talker_lm`,
docs/decisions/qwen3-omni-talker-on-vllm.md) and manifest.json, whose "release" field says
where the release is: "release" (inside, tiny) or the absolute path of a real one, which is read
where it lies and never copied. A build whose manifest still matches is skipped; otherwise it
is rebuilt whole in a staging directory under a file lock (`build_support.build_once`). The
family has no stages yet (its code2wav renders in torch, `code2wav.py`), so the registry does
not list it.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.families.kit.build_support import (
    build_once,
    manifest_matches,
    write_manifest,
)
from pipeline.families.kit.release_build import (
    TINY_RELEASE,
    Step,
    built_family_dir,
    release_fields,
    run_steps,
)
from pipeline.families.qwen3_omni.release import check_release, write_tiny_release
from pipeline.families.qwen3_omni.talker_lm import write_talker_lm
from pipeline.families.qwen3_omni.thinker_lm import write_thinker_lm

FAMILY = "qwen3_omni"
RECIPE = "qwen3-omni-3"  # bump when the build changes what it writes: old builds are rebuilt
SEED = 2025
THINKER_LM = "thinker_lm"
TALKER_LM = "talker_lm"


def build_qwen3_omni(models_dir: Path, progress: bool = True, seed: int = SEED,
                     release: Path | None = None, dummy_weights: bool = False) -> Path:
    """Build (or find already built) the family under `models_dir`; its directory.

    `release`: a real Qwen3-Omni release directory (checked first); None builds the tiny
    random one from `seed`. `dummy_weights`: the release is weightless
    (`real_stages.write_dummy_release`), and so are the LMs derived from it.
    """
    if release is not None:
        release = Path(release).resolve()
        check_release(release)
    fields = release_fields(FAMILY, RECIPE, seed, release)
    if dummy_weights:  # only then: builds from before the option still match
        fields["dummy_weights"] = True
    return build_once(models_dir, FAMILY, lambda target: manifest_matches(target, fields),
                      lambda staging: _write_all(staging, release, fields, progress))


def built_family(models_dir: Path | str) -> Path:
    """The built family's directory under `models_dir`; a clear error if it is not built."""
    return built_family_dir(models_dir, FAMILY, "Qwen3-Omni")


def _write_all(root: Path, release: Path | None, fields: dict, progress: bool) -> None:
    source = release or root / TINY_RELEASE
    dummy = bool(fields.get("dummy_weights"))
    steps: list[Step] = []
    if release is None:
        steps.append(("tiny release (random weights)",
                      lambda: write_tiny_release(source, int(fields["seed"]))))
    steps += [
        ("thinker LM", lambda: write_thinker_lm(source, root / THINKER_LM, dummy)),
        ("talker LM", lambda: write_talker_lm(source, root / TALKER_LM, dummy)),
        ("manifest", lambda: write_manifest(root, fields)),
    ]
    run_steps(FAMILY, steps, progress)
