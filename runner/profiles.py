"""Tag profiles: what the public sources say about each known AgentIssue-Bench tag, as package data.

The data (``runner/data/tag_profiles.toml``) is read once and validated; a
profile only fills settings the operator did not give (flags and the
reference's environment variables win), and an unknown tag gets the runner's
defaults. A profile's ``defects`` may make a tag unscorable: ``refusal`` names
why, as a reason label, so precheck can refuse it before any codex token.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from reducers.models import Frozen

from runner.errors import ProfileDataError, first_problem

PROFILES_RESOURCE = "tag_profiles.toml"
# The settings a profile may supply.
PROFILED_FIELDS = ("image", "source_dir", "apply_cmd", "test_cmd", "eval_network", "eval_timeout")
PATCH_ARGUMENT = "/patches/attempt.patch"  # runner.settings.PATCH_IN_CONTAINER (not imported: no cycle)

# Every defect a profile may name: the reason label when it makes a tag unscorable, else None
# (then it is a warning: recorded, shown by --list-tags, never refused).
DEFECTS: dict[str, str | None] = {
    "no_apply_patch": "layout_unsupported: no apply_patch",
    "no_test_patched": "layout_unsupported: no test_patched",
    "apply_never_returns": "apply_never_returns",
    "apply_ignores_patch": "apply_ignores_patch",
    "apply_always_fails": "apply_always_fails",
    "source_dir_mismatch": "layout_unsupported: entrypoint and image disagree on the source dir",
    "patch_targets_site_packages": "layout_unsupported: the patch target is site-packages, not the tree",
    "no_official_success_string": "no_official_success_string",
    "source_cloned_at_runtime": None,  # the image's layout probe refuses it when the tree is absent
    "entrypoint_not_stored": None,
    "fixed_tree_on_pythonpath": None,
    "unknown_command_exits_zero": None,
    "test_ignores_tree": None,
    "inverted_test": None,
    "api_key_check": None,
    "timing_based_test": None,
    "workdir_dependent": None,
    "build_output_in_tree": None,
    "no_python_binary": None,
    "passes_unpatched_without_network": None,
    "reproduce_script_name_mismatch": None,
}
Defect = Literal[tuple(DEFECTS)]  # type: ignore[valid-type]


class Defaults(Frozen):
    repository: str
    repository_aliases: list[str] = Field(default_factory=list)
    entrypoint: str
    source_dir: str
    eval_network: Literal["bridge", "host", "none"]
    eval_timeout: float = Field(gt=0)


class TagProfile(Frozen):
    """One tag as the public sources describe it; the commands are derived from the entrypoint."""

    name: str
    family: str
    lang: str
    notes: str
    aliases: list[str] = Field(default_factory=list)
    image_tag: str = ""
    repository: str = ""
    entrypoint: str = ""
    source_dir: str = ""
    apply_cmd: str = ""
    test_cmd: str = ""
    eval_network: Literal["bridge", "host", "none"] = "bridge"
    eval_timeout: float = Field(300.0, gt=0)
    needs_network: bool = False
    defects: list[Defect] = Field(default_factory=list)
    possible_defects: list[Defect] = Field(default_factory=list)
    official: str = ""

    @model_validator(mode="after")
    def _commands(self) -> TagProfile:
        object.__setattr__(self, "image_tag", self.image_tag or self.name)
        object.__setattr__(self, "apply_cmd", self.apply_cmd or f"{self.entrypoint} apply_patch {PATCH_ARGUMENT}")
        object.__setattr__(self, "test_cmd", self.test_cmd or f"{self.entrypoint} test_patched")
        return self

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.image_tag}"

    @property
    def refusal(self) -> str | None:
        """The reason label that makes this tag unscorable, or None."""
        return next((DEFECTS[d] for d in self.defects if DEFECTS[d]), None)

    def settings_values(self) -> dict[str, object]:
        """The settings this profile supplies (each only where the operator gave none)."""
        return {
            "image": self.image,
            "source_dir": self.source_dir,
            "apply_cmd": self.apply_cmd,
            "test_cmd": self.test_cmd,
            "eval_network": self.eval_network,
            "eval_timeout": self.eval_timeout,
        }


class ProfileTable(Frozen):
    defaults: Defaults
    profiles: dict[str, TagProfile]
    by_alias: dict[str, str]


def _parse(raw: dict) -> ProfileTable:
    defaults = Defaults.model_validate(raw.get("defaults", {}))
    inherited = defaults.model_dump(exclude={"repository_aliases"})
    profiles: dict[str, TagProfile] = {}
    by_alias: dict[str, str] = {}
    for name, table in (raw.get("tags") or {}).items():
        given = {key: value for key, value in table.items()}
        profile = TagProfile.model_validate({**inherited, **given, "name": name})
        profiles[name] = profile
        for spelling in (name, *profile.aliases):
            if spelling in by_alias:
                raise ProfileDataError(f"{PROFILES_RESOURCE}: tag spelling {spelling!r} is given twice")
            by_alias[spelling] = name
    return ProfileTable(defaults=defaults, profiles=profiles, by_alias=by_alias)


@lru_cache(maxsize=1)
def profile_table() -> ProfileTable:
    """The shipped table, read once.

    Raises:
        ProfileDataError: the file is missing or does not validate (names the problem).
    """
    try:
        text = resources.files("runner.data").joinpath(PROFILES_RESOURCE).read_text(encoding="utf-8")
        return _parse(tomllib.loads(text))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ProfileDataError(f"{PROFILES_RESOURCE} cannot be read ({type(e).__name__}: {e})") from e
    except ValidationError as e:
        raise ProfileDataError(f"{PROFILES_RESOURCE}: {first_problem(e)}") from e


def profile_for(tag: str) -> TagProfile | None:
    """The profile of ``tag`` under any of its spellings; None for an unknown tag."""
    table = profile_table()
    name = table.by_alias.get(tag)
    return table.profiles[name] if name else None


def list_tags() -> list[dict[str, object]]:
    """Every profile as a flat public row, for ``--list-tags``."""
    rows = []
    for name in sorted(profile_table().profiles):
        p = profile_table().profiles[name]
        rows.append({
            "tag": p.name,
            "aliases": ",".join(p.aliases) or "-",
            "image": p.image,
            "family": p.family,
            "entrypoint": p.entrypoint,
            "source_dir": p.source_dir,
            "eval_network": p.eval_network,
            "eval_timeout": p.eval_timeout,
            "needs_network": p.needs_network,
            "refusal": p.refusal or "-",
            "defects": ",".join(p.defects) or "-",
            "possible_defects": ",".join(p.possible_defects) or "-",
            "official": p.official or "-",
        })
    return rows
