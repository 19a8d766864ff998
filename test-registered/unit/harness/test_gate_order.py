"""The large-launch modules of side-by-side sessions are spread over their runs
(``overlay_harness.gate.staggered``), so the sessions do not queue at the gate together."""

from overlay_harness import gate, ports

# (module, large?) per test, in collection order.
ITEMS = [("a", False), ("a", False), ("b", False), ("pd", True), ("pd", True), ("c", False)]
ITEMS += [("c", False), ("d", False), ("e", False), ("e", False)]


def order(share: tuple[int, int]) -> list[str]:
    items = gate.staggered(
        ITEMS, module_of=lambda item: item[0], large=lambda item: item[1], share=share
    )
    return [module for module, _ in items]


def test_the_first_session_runs_its_large_launches_first_and_the_last_last() -> None:
    assert order((0, 3))[:2] == ["pd", "pd"]
    assert order((2, 3))[-2:] == ["pd", "pd"]


def test_a_middle_session_runs_them_between_whole_modules() -> None:
    middle = order((1, 3))
    start = middle.index("pd")
    assert 0 < start < len(middle) - 2
    assert middle[start : start + 2] == ["pd", "pd"]
    # No module is split around them (a unittest class's shared launch stays one launch).
    assert middle[start - 1] != middle[start + 2]


def test_every_test_runs_once_and_the_others_keep_their_order() -> None:
    for index in range(3):
        moved = order((index, 3))
        assert sorted(moved) == sorted(module for module, _ in ITEMS)
        assert [m for m in moved if m != "pd"] == [m for m, large in ITEMS if not large]


def test_a_session_alone_takes_the_share_of_index_0() -> None:
    assert ports.parse_share(None) == (0, 1)
    assert ports.parse_share("2/3") == (2, 3)
    assert order(ports.parse_share(None))[:2] == ["pd", "pd"]
