"""pipeline.store's kept input: one large input kept per process, replaced by another key, let
go of."""

from __future__ import annotations

import gc
import weakref

from pipeline.store import release_input, reuse_input


class _Big:
    """Stands for a flattened workload (weak-referenceable, unlike a list)."""


def test_one_input_is_kept_and_a_new_key_or_release_lets_it_go() -> None:
    built: list[str] = []

    def build(name: str) -> _Big:
        built.append(name)
        return _Big()

    first = reuse_input(("sim", "a"), lambda: build("a"))
    assert reuse_input(("sim", "a"), lambda: build("a")) is first
    assert built == ["a"]
    gone = weakref.ref(first)
    del first
    second = reuse_input(("sim", "b"), lambda: build("b"))
    gc.collect()
    assert gone() is None  # replaced, not kept beside the new one
    assert reuse_input(("sim", "b"), lambda: build("b")) is second and built == ["a", "b"]
    kept = weakref.ref(second)
    del second
    release_input()
    gc.collect()
    assert kept() is None
    reuse_input(("sim", "b"), lambda: build("b"))
    assert built == ["a", "b", "b"]
    release_input()


def test_the_prefix_stage_lets_go_of_what_the_simulation_kept() -> None:
    """In one process (an in-process Dagster run) the prefix stage does not hold its tables
    beside the simulation's flattened workload."""
    from pipeline.config import default_config
    from pipeline.prefix import stage as prefix_stage
    from tests.test_sim_cache import canonical

    kept = weakref.ref(reuse_input(("simulation", "w"), _Big))
    table = canonical(
        [{"hashes": [1, 2], "prompt_tokens": 9}, {"hashes": [1, 3], "prompt_tokens": 9}], 4
    )
    prefix_stage.run(prefix_stage.inputs_from(table), default_config().prefix)
    gc.collect()
    assert kept() is None
