"""The configuration space: parameters, safe constraints, encoding, neighbours and inference."""

from __future__ import annotations

import builtins
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from compass.domain import space as space_module
from compass.domain.evaluation import ParamValue
from compass.domain.space import (
    MAX_SPACE_SIZE,
    Constraint,
    ParameterSpec,
    Space,
    SpaceError,
    SpaceSpec,
    config_key,
    explain_validation_error,
)

RAG: dict[str, Any] = {
    "parameters": [
        {"name": "retriever_k", "type": "integer", "values": [20, 5, 10]},
        {"name": "reranker_k", "type": "integer", "values": [5, 3, 10]},
        {"name": "model", "values": ["small", "large", "medium"]},
        {"name": "temperature", "type": "float", "values": [0.1, 1.0, 0.01], "scale": "log"},
    ],
    "constraints": ["reranker_k <= retriever_k"],
}


def _rag() -> Space:
    return Space.from_spec(RAG)


def _error(data: dict[str, Any]) -> str:
    """The one-line message a user sees for an invalid space."""
    with pytest.raises(ValidationError) as info:
        SpaceSpec.model_validate(data)
    return explain_validation_error(info.value)


def _with_constraint(text: str) -> dict[str, Any]:
    return {"parameters": RAG["parameters"], "constraints": [text]}


# -- parameters ------------------------------------------------------------------------------


def test_value_order_categorical_kept_numbers_sorted() -> None:
    """Categories keep the user's order (it is their encoding); numbers are sorted ascending so
    a step means the adjacent value; integral floats of an integer parameter become ints."""
    space = _rag()
    by_name = {p.name: p for p in space.parameters}
    assert by_name["model"].values == ["small", "large", "medium"]
    assert by_name["retriever_k"].values == [5, 10, 20]
    assert by_name["temperature"].values == [0.01, 0.1, 1.0]
    spec = ParameterSpec(name="k", type="integer", values=[4.0, 2, 3.0])
    assert spec.values == [2, 3, 4]
    assert all(type(v) is int for v in spec.values)


def test_positions_linear_log_and_categorical() -> None:
    """Linear numbers by value, log numbers by log value, categories by list position."""
    linear = ParameterSpec(name="a", type="integer", values=[1, 10, 100])
    log = ParameterSpec(name="b", type="integer", values=[1, 10, 100], scale="log")
    categorical = ParameterSpec(name="c", values=["x", "y", "z", "w"])
    single = ParameterSpec(name="d", type="float", values=[0.5])
    np.testing.assert_allclose(linear.positions(), [0.0, 9 / 99, 1.0])
    np.testing.assert_allclose(log.positions(), [0.0, 0.5, 1.0])
    np.testing.assert_allclose(categorical.positions(), [0.0, 1 / 3, 2 / 3, 1.0])
    np.testing.assert_allclose(single.positions(), [0.0])


@pytest.mark.parametrize(
    ("parameter", "fragments"),
    [
        ({"name": "k", "values": []}, ["parameters.0.values", "at least 1"]),
        ({"name": "k", "values": [5, 10, 5]}, ["parameters.0.values", "5 is listed twice"]),
        ({"name": "k", "values": [20, 20.0]}, ["parameters.0.values", "20.0 is listed twice"]),
        ({"name": "k", "values": ["a", "b", "a"]}, ["parameters.0.values", "'a' is listed twice"]),
        ({"name": "k", "type": "integer", "values": [1, 2.5]}, ["k: 2.5 is not a integer"]),
        ({"name": "k", "type": "float", "values": [1, "x"]}, ["k: 'x' is not a float"]),
        ({"name": "k", "type": "integer", "values": [1, True]}, ["k: True is not a integer"]),
        (
            {"name": "k", "type": "integer", "values": [0, 1], "scale": "log"},
            ["k: scale: log needs values > 0"],
        ),
        ({"name": "k", "values": ["a", "b"], "scale": "log"}, ["k: scale applies to integer"]),
        ({"name": "1k", "values": [1]}, ["parameters.0.name"]),
        ({"name": "k", "values": [1], "step": 2}, ["parameters.0.step", "Extra inputs"]),
    ],
)
def test_invalid_parameters_name_the_field(parameter: dict[str, Any], fragments: list[str]) -> None:
    """Every invalid parameter is refused with the field (or parameter) and the problem named."""
    message = _error({"parameters": [parameter]})
    for fragment in fragments:
        assert fragment in message, message


def test_true_and_one_are_different_values_but_a_duplicate_name_is_not_allowed() -> None:
    """A categorical may hold both True and 1; declaring one parameter twice is refused."""
    spec = ParameterSpec(name="flag", values=[True, 1, "1"])
    assert spec.values == [True, 1, "1"]
    message = _error({"parameters": [{"name": "k", "values": [1]}, {"name": "k", "values": [2]}]})
    assert "parameter 'k' is declared twice" in message
    assert "at least 1" in _error({"parameters": []})


# -- constraints -----------------------------------------------------------------------------


def test_constraint_filters_the_product() -> None:
    """reranker_k <= retriever_k keeps exactly the pairs that satisfy it, for every other value."""
    space = _rag()
    pairs = sum(1 for r, k in itertools.product([5, 10, 20], [3, 5, 10]) if k <= r)
    assert space.size == pairs * 3 * 3
    configs = [space.config(i) for i in range(space.size)]
    assert all(
        isinstance(c["reranker_k"], int)
        and isinstance(c["retriever_k"], int)
        and c["reranker_k"] <= c["retriever_k"]
        for c in configs
    )
    assert len({config_key(c) for c in configs}) == space.size


@pytest.mark.parametrize(
    ("text", "keep"),
    [
        ("reranker_k <= retriever_k", lambda c: c["reranker_k"] <= c["retriever_k"]),
        ("retriever_k > reranker_k", lambda c: c["retriever_k"] > c["reranker_k"]),
        ("reranker_k == retriever_k", lambda c: c["reranker_k"] == c["retriever_k"]),
        ("retriever_k >= 10", lambda c: c["retriever_k"] >= 10),
        ("10 < retriever_k", lambda c: c["retriever_k"] > 10),
        ("temperature<1e-1", lambda c: c["temperature"] < 0.1),
        ("model != 'large'", lambda c: c["model"] != "large"),
        ('model == "small"', lambda c: c["model"] == "small"),
        ("retriever_k != -5", lambda c: True),
    ],
)
def test_constraint_grammar(text: str, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Each operator, literal kind and operand order selects exactly the configurations the
    same comparison selects in Python."""
    space = Space.from_spec(_with_constraint(text))
    full = Space.from_spec({"parameters": RAG["parameters"]})
    expected = {config_key(c) for c in map(full.config, range(full.size)) if keep(c)}
    assert {config_key(space.config(i)) for i in range(space.size)} == expected


INJECTIONS = [
    "__import__('os').system('x') <= 1",
    "retriever_k.__class__ <= 1",
    "retriever_k.real <= 1",
    "len(retriever_k) <= 1",
    "retriever_k() <= 1",
    "retriever_k[0] <= 1",
    "eval('1') <= retriever_k",
    "lambda: 0 <= retriever_k",
    "reranker_k <= retriever_k <= 20",
    "1 <= reranker_k <= 5",
    "reranker_k <= retriever_k and model == 'x'",
    "reranker_k <= retriever_k or 1",
    "retriever_k + 1 <= 5",
    "retriever_k <= 5; import os",
    "retriever_k <= 5 # comment",
    "retriever_k = 5",
    "retriever_k <=",
    "<= 5",
    "retriever_k",
    "",
    "not retriever_k",
    "retriever_k <= <= 5",
    "5 <= 6",
    "'a' == 'a'",
]


@pytest.mark.parametrize("text", INJECTIONS)
def test_constraints_are_parsed_never_evaluated(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Code, attribute access, calls, chains and boolean logic are refused with a message that
    quotes the constraint; eval, exec and compile are never reached."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the constraint parser must not evaluate code")

    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, forbidden)
    parameters = {
        p.name: p for p in SpaceSpec.model_validate({"parameters": RAG["parameters"]}).parameters
    }
    with pytest.raises(SpaceError) as info:
        Constraint.parse(text, parameters)
    monkeypatch.undo()
    message = str(info.value)
    assert repr(text) in message
    assert any(hint in message for hint in ("OP", "A OP B", "two literals", "unknown parameter"))
    assert repr(text) in _error(_with_constraint(text))


def test_unknown_parameter_names_it_and_the_known_ones() -> None:
    """A typo names the unknown word and lists the parameters it could have meant."""
    message = _error(_with_constraint("rerank_k <= retriever_k"))
    assert "unknown parameter 'rerank_k'" in message
    assert "known parameters: retriever_k, reranker_k, model, temperature" in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("model <= 'large'", "model is categorical; only == and != compare"),
        ("model < retriever_k", "model is categorical"),
        ("retriever_k == 'ten'", "retriever_k is numeric but 'ten' is not a number"),
        ("model == 'huge'", "'huge' is not a value of model (values: small, large, medium)"),
        ("retriever_k <= true", "retriever_k is numeric but True is not a number"),
    ],
)
def test_ill_typed_constraints_are_refused(text: str, fragment: str) -> None:
    """Comparisons that cannot mean anything are refused, naming the parameter and the fix."""
    assert fragment in _error(_with_constraint(text))


def test_constraint_that_nothing_satisfies() -> None:
    """A space whose constraints exclude every configuration is an error, not an empty search."""
    with pytest.raises(SpaceError, match="no configuration satisfies every constraint"):
        Space.from_spec(_with_constraint("retriever_k > 20"))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789 <>=!'\"().+-*/[],:;#", max_size=40))
def test_any_text_parses_to_a_comparison_or_a_space_error(text: str) -> None:
    """Whatever the text, the parser either yields one comparison between a parameter and a
    parameter or literal, or raises SpaceError; no other exception escapes."""
    parameters = {"a": ParameterSpec(name="a", type="integer", values=[1, 2, 3])}
    parameters["b"] = ParameterSpec(name="b", values=["x", "y"])
    try:
        constraint = Constraint.parse(text, parameters)
    except SpaceError:
        return
    assert constraint.op in ("<=", ">=", "==", "!=", "<", ">")
    sides = (constraint.left, constraint.right)
    assert any(side.parameter in parameters for side in sides)
    assert all(side.parameter in parameters or side.parameter is None for side in sides)


# -- size, encoding, lookup ------------------------------------------------------------------


def test_size_limit_is_checked_before_enumerating() -> None:
    """A space too large to enumerate is refused at once, with the count and the limit."""
    values = list(range(200))
    data = {"parameters": [{"name": n, "type": "integer", "values": values} for n in "abc"]}
    assert MAX_SPACE_SIZE < 200**3
    with pytest.raises(SpaceError, match="8,000,000 combinations; compass enumerates at most"):
        Space.from_spec(data)


def test_a_space_near_the_size_limit_enumerates_in_order_and_indexes_exactly() -> None:
    """1.92M combinations, one constraint: the rows are the valid product in lexicographic
    order, and index, config and neighbours agree on a spread of them."""
    sizes = [20, 20, 20, 20, 12]
    names = ["a", "b", "c", "d", "e"]
    assert math.prod(sizes) <= MAX_SPACE_SIZE
    data = {
        "parameters": [
            {"name": n, "type": "integer", "values": list(range(k))}
            for n, k in zip(names, sizes, strict=True)
        ],
        "constraints": ["a <= b"],
    }
    space = Space.from_spec(data)
    assert space.size == (20 * 21 // 2) * 20 * 20 * 12
    radix = [math.prod(sizes[j + 1 :]) for j in range(len(sizes))]
    assert np.all(np.diff(space.rows @ np.array(radix)) > 0)
    for index in range(0, space.size, space.size // 97):
        config = space.config(index)
        assert config["a"] <= config["b"]
        assert space.index(config) == index
        for other in space.neighbours(index):
            assert sum(space.config(other)[n] != config[n] for n in names) == 1
            assert space.config(other)["a"] <= space.config(other)["b"]
    with pytest.raises(SpaceError, match="violates a constraint"):
        space.index({"a": 5, "b": 4, "c": 0, "d": 0, "e": 0})


def test_index_and_config_round_trip_with_clear_errors() -> None:
    """Every configuration maps to its index and back; 20.0 finds 20; outsiders are named."""
    space = _rag()
    for i in range(space.size):
        assert space.index(space.config(i)) == i
    config = dict(space.config(0))
    config["retriever_k"] = float(config["retriever_k"])
    assert space.index(config) == 0
    assert config in space
    assert "not a dict" not in space
    with pytest.raises(SpaceError, match="violates a constraint"):
        space.index({"retriever_k": 5, "reranker_k": 10, "model": "small", "temperature": 0.1})
    with pytest.raises(SpaceError, match=r"7 is not a value of retriever_k \(values: 5, 10, 20\)"):
        space.index({"retriever_k": 7, "reranker_k": 3, "model": "small", "temperature": 0.1})
    with pytest.raises(SpaceError, match="does not set 'temperature'"):
        space.index({"retriever_k": 5, "reranker_k": 3, "model": "small"})
    with pytest.raises(SpaceError, match="sets 'top_p', which is not a parameter"):
        space.index({**space.config(0), "top_p": 0.9})
    odd = {**space.config(0), "reranker_k": True}
    assert odd not in space


@st.composite
def _spaces(draw: st.DrawFn) -> Space:
    """Small random spaces: 1-4 parameters of every kind, optionally one constraint."""
    count = draw(st.integers(1, 4))
    parameters = []
    for j in range(count):
        kind = draw(st.sampled_from(["categorical", "integer", "float"]))
        size = draw(st.integers(1, 5))
        if kind == "categorical":
            values: list[ParamValue] = [f"v{i}" for i in range(size)]
            values = draw(st.permutations(values))
            parameters.append({"name": f"p{j}", "values": values})
        else:
            numbers = draw(st.lists(st.integers(1, 50), min_size=size, max_size=size, unique=True))
            scale = draw(st.sampled_from(["linear", "log"]))
            cast: list[ParamValue] = (
                [float(n) / 4 for n in numbers] if kind == "float" else list(numbers)
            )
            parameters.append({"name": f"p{j}", "type": kind, "values": cast, "scale": scale})
    constraints = []
    numeric = [p["name"] for p in parameters if p.get("type") in ("integer", "float")]
    if len(numeric) >= 2 and draw(st.booleans()):
        constraints.append(f"{numeric[0]} <= {numeric[1]}")
    try:
        return Space(
            SpaceSpec.model_validate({"parameters": parameters, "constraints": constraints})
        )
    except SpaceError:
        return Space(SpaceSpec.model_validate({"parameters": parameters}))


def _brute_force(space: Space) -> list[dict[str, ParamValue]]:
    """Every valid configuration, checked with Python comparisons, not the space's code."""
    names = [p.name for p in space.parameters]
    found = []
    for combo in itertools.product(*(p.values for p in space.parameters)):
        config = dict(zip(names, combo, strict=True))
        ok = True
        for constraint in space.constraints:
            assert constraint.op == "<="
            left, right = constraint.left.parameter, constraint.right.parameter
            assert left is not None
            assert right is not None
            left_value, right_value = config[left], config[right]
            assert not isinstance(left_value, str)
            assert not isinstance(right_value, str)
            ok = ok and left_value <= right_value
        if ok:
            found.append(config)
    return found


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_spaces())
def test_space_is_the_valid_product_and_encodes_into_unit_cube(space: Space) -> None:
    """The rows are exactly the valid combinations; every encoded coordinate lies in [0, 1],
    is ordered like the values along a numeric axis, and spans [0, 1] in a full product."""
    expected = {config_key(c) for c in _brute_force(space)}
    assert {config_key(space.config(i)) for i in range(space.size)} == expected
    encoded = space.encoded
    assert encoded.shape == (space.size, len(space.parameters))
    assert ((encoded >= 0) & (encoded <= 1)).all()
    for j, spec in enumerate(space.parameters):
        positions = spec.positions()
        assert positions[0] == 0
        if len(spec.values) > 1:
            assert positions[-1] == pytest.approx(1.0)
            assert all(a < b for a, b in itertools.pairwise(positions))
        np.testing.assert_allclose(encoded[:, j], positions[space.rows[:, j]])
        if spec.numeric and spec.scale.value == "log" and len(spec.values) > 2:
            logs = np.log([float(v) for v in spec.values])
            np.testing.assert_allclose(positions, (logs - logs[0]) / (logs[-1] - logs[0]))
    assert space.categorical.tolist() == [not p.numeric for p in space.parameters]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_spaces(), st.data())
def test_neighbours_differ_in_exactly_one_parameter_and_respect_constraints(
    space: Space, data: st.DataObject
) -> None:
    """neighbours = every valid configuration differing in exactly one parameter;
    step_neighbours = those whose differing value is adjacent (numbers) or any (categories)."""
    index = data.draw(st.integers(0, space.size - 1))
    row = space.rows[index]
    all_one = set()
    steps = set()
    for other in range(space.size):
        differ = np.flatnonzero(space.rows[other] != row)
        if len(differ) != 1:
            continue
        all_one.add(other)
        j = int(differ[0])
        if not space.parameters[j].numeric or abs(int(space.rows[other][j]) - int(row[j])) == 1:
            steps.add(other)
    neighbours = space.neighbours(index)
    step_neighbours = space.step_neighbours(index)
    assert len(neighbours) == len(set(neighbours))
    assert set(neighbours) == all_one
    assert set(step_neighbours) == steps
    assert index not in neighbours
    for other in neighbours:
        assert index in space.neighbours(other)  # symmetric
        assert space.config(other) in space


def test_step_neighbours_with_a_constraint_by_hand() -> None:
    """At retriever_k 10, reranker_k 10: stepping retriever_k down to 5 would break the
    constraint, so only 20 is offered; reranker_k offers 5; the model offers both others."""
    space = _rag()
    here = space.index({"retriever_k": 10, "reranker_k": 10, "model": "large", "temperature": 0.1})
    got = [space.config(i) for i in space.step_neighbours(here)]
    changed = sorted((k, v) for c in got for k, v in c.items() if v != space.config(here)[k])
    assert changed == [
        ("model", "medium"),
        ("model", "small"),
        ("reranker_k", 5),
        ("retriever_k", 20),
        ("temperature", 0.01),
        ("temperature", 1.0),
    ]
    everything = [space.config(i) for i in space.neighbours(here)]
    assert {"retriever_k": 10, "reranker_k": 3, "model": "large", "temperature": 0.1} in everything
    assert all(float(c["reranker_k"]) <= float(c["retriever_k"]) for c in everything)


def test_distances_treat_categories_as_equal_or_not() -> None:
    """Numbers contribute their encoded gap; any two different categories are 1 apart."""
    space = Space.from_spec(
        {
            "parameters": [
                {"name": "k", "type": "integer", "values": [0, 5, 10]},
                {"name": "m", "values": ["a", "b", "c"]},
            ]
        }
    )
    origin = space.index({"k": 0, "m": "a"})
    others = np.array([space.index({"k": 5, "m": "a"}), space.index({"k": 0, "m": "c"})])
    others = np.append(others, space.index({"k": 10, "m": "b"}))
    np.testing.assert_allclose(space.distances(origin, others), [0.5, 1.0, math.sqrt(2)])


# -- inference and keys ----------------------------------------------------------------------


def test_infer_spans_the_recorded_configurations_only() -> None:
    """Numbers sorted, categories in first-seen order, 20.0 is 20; a combination of recorded
    values that was never recorded is not part of the space."""
    configs: list[dict[str, ParamValue]] = [
        {"k": 20, "model": "large", "t": 0.5, "flag": True},
        {"k": 5, "model": "small", "t": 0.25, "flag": 1},
        {"k": 20.0, "model": "small", "t": 0.5, "flag": True},
        {"k": 10, "model": "medium", "t": 0.25, "flag": "1"},
    ]
    space = Space.infer(configs)
    by_name = {p.name: p for p in space.parameters}
    assert by_name["k"].values == [5, 10, 20]
    assert by_name["k"].type.value == "integer"
    assert by_name["t"].type.value == "float"
    assert by_name["model"].values == ["large", "small", "medium"]
    assert by_name["model"].type.value == "categorical"
    assert by_name["flag"].values == [True, 1, "1"]
    assert space.size == 4
    for config in configs:
        assert config in space
    assert {"k": 5, "model": "large", "t": 0.5, "flag": True} not in space


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ([], "no configurations to infer a space from"),
        ([{"k": 1}, {"k": 2, "m": "a"}], "configuration 2 has parameters ['k', 'm']"),
    ],
)
def test_infer_errors(configs: list[dict[str, ParamValue]], message: str) -> None:
    """Nothing to infer from, or configurations that set different parameters, are refused."""
    with pytest.raises(SpaceError) as info:
        Space.infer(configs)
    assert message in str(info.value)


def test_config_key_is_canonical() -> None:
    """20 and 20.0 are one configuration; True and 1 are not; key order does not matter."""
    assert config_key({"k": 20, "m": "a"}) == config_key({"m": "a", "k": 20.0})
    assert config_key({"k": True}) != config_key({"k": 1})
    assert config_key({"k": 1.0}) != config_key({"k": True})
    assert config_key({"k": 0.5}) != config_key({"k": 0})
    assert config_key({"k": "20"}) != config_key({"k": 20})


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
        st.integers(-(10**6), 10**6) | st.booleans() | st.text(max_size=5) | st.floats(-1e6, 1e6),
        max_size=5,
    ),
    st.randoms(use_true_random=False),
)
def test_config_key_ignores_order_and_integral_floats(
    config: dict[str, ParamValue], random: Any
) -> None:
    """Reordering keys or writing integers as floats never changes the key; turning a number
    into a bool or a string always does."""
    items = list(config.items())
    random.shuffle(items)
    floated = {
        k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in items
    }
    assert config_key(dict(items)) == config_key(config) == config_key(floated)
    for name, value in config.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            assert config_key({**config, name: str(value)}) != config_key(config)
            if value in (0, 1):
                assert config_key({**config, name: bool(value)}) != config_key(config)


@pytest.mark.parametrize(
    "constraints",
    [[], ["b <= a"], ["a != 2", "b > 1"], ["c != 'y'", "a >= 3", "b < a"]],
)
def test_counting_a_space_agrees_with_building_it_across_blocks(
    constraints: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Space.count, which the operator uses, is the size of the built space, whatever the
    block boundaries fall on (blocks of 7 rows here, against 60 combinations)."""
    spec = SpaceSpec.model_validate(
        {
            "parameters": [
                {"name": "a", "type": "integer", "values": [1, 2, 3, 4, 5]},
                {"name": "b", "type": "integer", "values": [0, 1, 2, 3]},
                {"name": "c", "type": "categorical", "values": ["x", "y", "z"]},
            ],
            "constraints": constraints,
        }
    )
    monkeypatch.setattr(space_module, "COUNT_BLOCK", 7)
    assert Space.count(spec) == Space(spec).size


def test_counting_refuses_what_building_refuses() -> None:
    empty = SpaceSpec.model_validate(
        {
            "parameters": [{"name": "a", "type": "integer", "values": [1, 2]}],
            "constraints": ["a > 5"],
        }
    )
    with pytest.raises(SpaceError, match="no configuration satisfies"):
        Space.count(empty)
    huge = SpaceSpec.model_validate(
        {
            "parameters": [
                {"name": f"p{i}", "type": "integer", "values": list(range(10))} for i in range(7)
            ]
        }
    )
    with pytest.raises(SpaceError, match="compass enumerates at most"):
        Space.count(huge)
