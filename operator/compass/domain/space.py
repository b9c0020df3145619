"""The configuration space: parameters, constraints, enumeration, encoding and neighbours."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from compass.domain.arrays import BoolArray, FloatArray, IntArray
from compass.domain.evaluation import Config, ParamValue
from compass_rules.routing import config_key as config_key

# Enumeration is explicit: beyond this the search would need a sampler, and the user should hear.
MAX_SPACE_SIZE = 2_000_000
# Rows Space.count checks at a time (7 parameters: 3.5 MiB of indices and one column each).
COUNT_BLOCK = 1 << 16
NOTHING_SATISFIES = "no configuration satisfies every constraint; relax a constraint"
# List bounds in the schema, far above any workflow's, so the API server refuses the absurd.
MAX_PARAMETERS = 64
MAX_VALUES = 4096
MAX_CONSTRAINTS = 64
MAX_CONSTRAINT_LENGTH = 256
# A parameter name as the router's pipeline reads it (the schema's and a ledger's).
PARAMETER_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
MAX_PARAMETER_NAME = 63
# Values are matched as floats (20 and 20.0 are one): beyond 2**53 integers would collide.
MAX_NUMBER_MAGNITUDE = 2**53


class SpaceError(ValueError):
    """A space, a constraint or a configuration is invalid; the message names the fix."""


class ParameterType(StrEnum):
    """How a parameter's values relate to each other."""

    CATEGORICAL = "categorical"
    INTEGER = "integer"
    FLOAT = "float"


class Scale(StrEnum):
    """How a numeric parameter is spread over [0, 1]."""

    LINEAR = "linear"
    LOG = "log"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def value_problem(value: object) -> str | None:
    """What makes a parameter value unusable (NaN, inf, a huge integer), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value}, not a finite number"
    if abs(value) > MAX_NUMBER_MAGNITUDE:
        return f"{describe_number(value)}, beyond +-2**53"
    return None


def describe_number(value: int | float) -> str:
    """A number as a message shows it: a huge integer by its length, not its 400 digits."""
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _canonical(value: ParamValue) -> tuple[str, ParamValue]:
    """A hashable form in which 20 and 20.0 match but True and 1 do not."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("num", float(value))
    return ("str", value)


class ParameterSpec(BaseModel):
    """One tunable parameter of the workflow and the values it may take."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[
        str,
        Field(
            pattern=f"^{PARAMETER_NAME}$",
            max_length=MAX_PARAMETER_NAME,
            description="Parameter name, as the router's pipeline reads it (letters, digits, _).",
        ),
    ]
    type: ParameterType = Field(
        default=ParameterType.CATEGORICAL,
        description="categorical (values in the given order), integer or float.",
    )
    values: Annotated[
        list[ParamValue],
        Field(
            min_length=1,
            max_length=MAX_VALUES,
            description=f"The values it may take (at most {MAX_VALUES}); numbers are sorted.",
        ),
    ]
    scale: Scale = Field(
        default=Scale.LINEAR, description="For numbers: linear or log spacing of the values."
    )

    @field_validator("values")
    @classmethod
    def _no_duplicates(cls, values: list[ParamValue]) -> list[ParamValue]:
        seen: set[tuple[str, ParamValue]] = set()
        for value in values:
            problem = value_problem(value)
            if problem is not None:
                raise ValueError(f"value {problem}; give finite numbers within +-2**53")
            if _canonical(value) in seen:
                raise ValueError(f"value {value!r} is listed twice; list each value once")
            seen.add(_canonical(value))
        return values

    @model_validator(mode="after")
    def _values_match_type(self) -> ParameterSpec:
        if self.type is ParameterType.CATEGORICAL:
            if self.scale is not Scale.LINEAR:
                raise ValueError(f"{self.name}: scale applies to integer and float parameters only")
            return self
        bad = [v for v in self.values if not _is_number(v)]
        if self.type is ParameterType.INTEGER:
            bad += [v for v in self.values if _is_number(v) and not float(v).is_integer()]
        if bad:
            raise ValueError(
                f"{self.name}: {bad[0]!r} is not a {self.type.value}; "
                f"use type: categorical for non-numeric values"
            )
        if self.scale is Scale.LOG and any(float(v) <= 0 for v in self.values):
            raise ValueError(f"{self.name}: scale: log needs values > 0; use scale: linear")
        # Numbers have a natural order: keep them ascending so +-1 steps mean something.
        ordered = sorted(self.values, key=lambda v: float(v))
        if self.type is ParameterType.INTEGER:
            ordered = [int(v) for v in ordered]
        object.__setattr__(self, "values", ordered)
        return self

    @property
    def numeric(self) -> bool:
        """Whether values are numbers with an order and a distance."""
        return self.type is not ParameterType.CATEGORICAL

    def positions(self) -> FloatArray:
        """Each value's position in [0, 1]: by scale for numbers, by list order otherwise."""
        n = len(self.values)
        if n == 1:
            return np.zeros(1)
        if not self.numeric:
            return np.arange(n, dtype=np.float64) / (n - 1)
        raw: FloatArray = np.array([float(v) for v in self.values])
        if self.scale is Scale.LOG:
            raw = np.log(raw)
        spread: FloatArray = (raw - raw[0]) / (raw[-1] - raw[0])
        return spread


_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<op><=|>=|==|!=|<|>)
      | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
      | (?P<string>'[^']*'|"[^"]*")
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Operand:
    """One side of a constraint: a parameter name or a literal value."""

    parameter: str | None = None
    literal: ParamValue | None = None


@dataclass(frozen=True)
class Constraint:
    """A comparison between parameters, e.g. ``reranker_k <= retriever_k``."""

    text: str
    left: Operand
    op: str
    right: Operand

    @staticmethod
    def parse(text: str, parameters: Mapping[str, ParameterSpec]) -> Constraint:
        """Parse ``A op B`` with a small tokenizer (never eval) and check it against the space."""
        tokens: list[tuple[str, str]] = []
        position = 0
        stripped = text.strip()
        while position < len(stripped):
            match = _TOKEN.match(stripped, position)
            if not match or match.end() == position:
                raise SpaceError(
                    f"constraint {text!r}: cannot read {stripped[position:]!r}; "
                    f"write it as 'param OP param' or 'param OP value' with OP in "
                    f"{', '.join(_OPERATORS)}"
                )
            kind = match.lastgroup or ""
            tokens.append((kind, match.group(kind)))
            position = match.end()
        if len(tokens) != 3 or tokens[1][0] != "op" or "op" in (tokens[0][0], tokens[2][0]):
            raise SpaceError(
                f"constraint {text!r}: expected exactly 'A OP B', e.g. 'reranker_k <= retriever_k'"
            )
        left, right = (
            _operand(text, kind, raw, parameters) for kind, raw in (tokens[0], tokens[2])
        )
        op = tokens[1][1]
        if left.parameter is None and right.parameter is None:
            raise SpaceError(f"constraint {text!r}: compares two literals; name a parameter")
        constraint = Constraint(text=text, left=left, op=op, right=right)
        constraint._check_types(parameters)
        return constraint

    def _check_types(self, parameters: Mapping[str, ParameterSpec]) -> None:
        sides = [self.left, self.right]
        specs = [parameters[s.parameter] for s in sides if s.parameter is not None]
        ordered = self.op not in ("==", "!=")
        for spec in specs:
            if ordered and not spec.numeric:
                raise SpaceError(
                    f"constraint {self.text!r}: {spec.name} is categorical; only == and != "
                    f"compare categorical values"
                )
        for side, other in ((self.left, self.right), (self.right, self.left)):
            if side.parameter is None or other.parameter is not None:
                continue
            spec = parameters[side.parameter]
            literal = other.literal
            assert literal is not None
            if spec.numeric and not _is_number(literal):
                raise SpaceError(
                    f"constraint {self.text!r}: {spec.name} is numeric but {literal!r} is not "
                    f"a number"
                )
            if not spec.numeric and _canonical(literal) not in {_canonical(v) for v in spec.values}:
                raise SpaceError(
                    f"constraint {self.text!r}: {literal!r} is not a value of {spec.name} "
                    f"(values: {', '.join(map(str, spec.values))})"
                )

    def holds(self, columns: Mapping[str, npt.NDArray[Any]]) -> BoolArray:
        """Vectorised truth of the constraint over columns of parameter values."""

        def side(operand: Operand) -> Any:
            if operand.parameter is not None:
                return columns[operand.parameter]
            return operand.literal

        result = _OPERATORS[self.op](side(self.left), side(self.right))
        return np.asarray(result, dtype=bool)


def _operand(text: str, kind: str, raw: str, parameters: Mapping[str, ParameterSpec]) -> Operand:
    if kind == "number":
        number = float(raw)
        return Operand(literal=int(number) if number.is_integer() else number)
    if kind == "string":
        return Operand(literal=raw[1:-1])
    if raw in ("true", "false"):
        return Operand(literal=raw == "true")
    if raw not in parameters:
        raise SpaceError(
            f"constraint {text!r}: unknown parameter {raw!r}; known parameters: "
            f"{', '.join(parameters)} (quote a categorical value: '{raw}')"
        )
    return Operand(parameter=raw)


class SpaceSpec(BaseModel):
    """The configuration space a user declares (CompoundWorkflow.spec.space)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parameters: Annotated[
        list[ParameterSpec],
        Field(
            min_length=1,
            max_length=MAX_PARAMETERS,
            description=f"The components' tunable parameters (at most {MAX_PARAMETERS}; at most "
            f"{MAX_SPACE_SIZE:,} combinations of their values).",
        ),
    ]
    constraints: list[Annotated[str, Field(max_length=MAX_CONSTRAINT_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_CONSTRAINTS,
        description="Comparisons every configuration must satisfy, e.g. 'reranker_k <= "
        f"retriever_k' (at most {MAX_CONSTRAINTS}, each at most {MAX_CONSTRAINT_LENGTH} "
        "characters).",
    )

    @model_validator(mode="after")
    def _check(self) -> SpaceSpec:
        names = [p.name for p in self.parameters]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"parameter {duplicates[0]!r} is declared twice; declare it once")
        by_name = {p.name: p for p in self.parameters}
        for text in self.constraints:
            try:
                Constraint.parse(text, by_name)
            except SpaceError as error:
                raise ValueError(str(error)) from None
        return self


class Space:
    """Every valid configuration of a SpaceSpec, as rows of value indices."""

    def __init__(self, spec: SpaceSpec, members: Iterable[Config] | None = None) -> None:
        shape = self._take_rules(spec)
        if members is None:
            rows = np.indices(shape, dtype=np.int64).reshape(len(shape), -1).T
        else:
            rows = np.array(sorted({self._row(c) for c in members}), dtype=np.int64).reshape(
                -1, len(self.parameters)
            )
        rows = rows[self._satisfies(rows)]
        if len(rows) == 0:
            raise SpaceError(NOTHING_SATISFIES)
        self.rows: IntArray = np.ascontiguousarray(rows)
        self._codes: IntArray = self.rows @ self._radix

    def _take_rules(self, spec: SpaceSpec) -> tuple[int, ...]:
        """Take the spec's parameters, constraints and lookups; its shape, within the limit."""
        self.spec = spec
        self.parameters: tuple[ParameterSpec, ...] = tuple(spec.parameters)
        self.names: tuple[str, ...] = tuple(p.name for p in self.parameters)
        by_name = {p.name: p for p in self.parameters}
        self.constraints = tuple(Constraint.parse(t, by_name) for t in spec.constraints)
        self._value_index = [
            {_canonical(v): i for i, v in enumerate(p.values)} for p in self.parameters
        ]
        shape = tuple(len(p.values) for p in self.parameters)
        product = math.prod(shape)
        if product > MAX_SPACE_SIZE:
            raise SpaceError(
                f"space has {product:,} combinations; compass enumerates at most "
                f"{MAX_SPACE_SIZE:,}: drop values or split the search"
            )
        # A configuration's code is its row read as a mixed-radix number, so rows in
        # lexicographic order have increasing codes and a lookup is a binary search: no Python
        # object per configuration (a dict of 2M tuples cost seconds and ~300 MiB).
        self._radix: IntArray = np.array(
            [math.prod(shape[j + 1 :]) for j in range(len(shape))], dtype=np.int64
        )
        return shape

    @staticmethod
    def count(spec: SpaceSpec) -> int:
        """The spec's space size, with the same checks as building it, in bounded memory."""
        rules = object.__new__(Space)
        shape = rules._take_rules(spec)
        total = math.prod(shape)
        found = 0
        for start in range(0, total, COUNT_BLOCK):
            codes = np.arange(start, min(total, start + COUNT_BLOCK), dtype=np.int64)
            rows = np.stack(np.unravel_index(codes, shape), axis=1).astype(np.int64)
            found += int(rules._satisfies(rows).sum())
        if found == 0:
            raise SpaceError(NOTHING_SATISFIES)
        return found

    def _find(self, row: Sequence[int]) -> int | None:
        """The index of the configuration with these value indices, None if it is not valid."""
        code = int(np.dot(row, self._radix))
        at = int(np.searchsorted(self._codes, code))
        return at if at < len(self._codes) and int(self._codes[at]) == code else None

    @staticmethod
    def from_spec(data: Mapping[str, Any]) -> Space:
        """Build a space from a parsed YAML/JSON mapping (pydantic validates it)."""
        return Space(SpaceSpec.model_validate(data))

    @staticmethod
    def infer(configs: Sequence[Config]) -> Space:
        """The space a set of recorded configurations spans, and nothing beyond it."""
        if not configs:
            raise SpaceError("no configurations to infer a space from")
        names = list(configs[0])
        # Each parameter's values by their canonical form, in the order first seen.
        values: dict[str, dict[tuple[str, ParamValue], ParamValue]] = {n: {} for n in names}
        for number, config in enumerate(configs, start=1):
            if sorted(config) != sorted(names):
                raise SpaceError(
                    f"configuration {number} has parameters {sorted(config)}, the first has "
                    f"{sorted(names)}: every configuration must set the same parameters"
                )
            for name in names:
                values[name].setdefault(_canonical(config[name]), config[name])
        parameters = []
        for name in names:
            if len(name) > MAX_PARAMETER_NAME or not re.fullmatch(PARAMETER_NAME, name):
                raise SpaceError(
                    f"parameter name {name!r} is not an identifier; start it with a letter or _ "
                    "and use only ASCII letters, digits and _ (at most 63)"
                )
            vals = list(values[name].values())
            if all(_is_number(v) for v in vals):
                integral = all(float(v).is_integer() for v in vals)
                kind = ParameterType.INTEGER if integral else ParameterType.FLOAT
            else:
                kind = ParameterType.CATEGORICAL
            try:
                parameters.append(ParameterSpec(name=name, type=kind, values=vals))
            except ValidationError as error:
                raise SpaceError(f"parameter {name!r}: {explain_validation_error(error)}") from None
        if not parameters:
            raise SpaceError("configuration 1 sets no parameters; give each one at least one")
        return Space(SpaceSpec(parameters=parameters), members=configs)

    def _row(self, config: Config) -> tuple[int, ...]:
        unknown = sorted(set(config) - set(self.names))
        if unknown:
            raise SpaceError(
                f"configuration {config_key(config)} sets {unknown[0]!r}, which is not a "
                f"parameter of the space ({', '.join(self.names)})"
            )
        row = []
        for spec, lookup in zip(self.parameters, self._value_index, strict=True):
            if spec.name not in config:
                raise SpaceError(f"configuration {config_key(config)} does not set {spec.name!r}")
            value = config[spec.name]
            try:
                row.append(lookup[_canonical(value)])
            except KeyError:
                raise SpaceError(
                    f"configuration {config_key(config)}: {value!r} is not a value of "
                    f"{spec.name} (values: {', '.join(map(str, spec.values))})"
                ) from None
        return tuple(row)

    def _satisfies(self, rows: IntArray) -> BoolArray:
        keep = np.ones(len(rows), dtype=bool)
        if not self.constraints or len(rows) == 0:
            return keep
        columns: dict[str, npt.NDArray[Any]] = {}
        for j, spec in enumerate(self.parameters):
            if spec.numeric:
                table: npt.NDArray[Any] = np.array([float(v) for v in spec.values])
            else:
                table = np.empty(len(spec.values), dtype=object)
                table[:] = spec.values
            columns[spec.name] = table[rows[:, j]]
        for constraint in self.constraints:
            keep &= constraint.holds(columns)
        return keep

    @property
    def size(self) -> int:
        """Number of valid configurations."""
        return len(self.rows)

    def config(self, index: int) -> dict[str, ParamValue]:
        """The configuration at an index, as a name -> value mapping."""
        row = self.rows[index]
        return {p.name: p.values[int(i)] for p, i in zip(self.parameters, row, strict=True)}

    def index(self, config: Config) -> int:
        """The index of a configuration; a clear error if it lies outside the space."""
        row = self._row(config)
        found = self._find(row)
        if found is None:
            raise SpaceError(
                f"configuration {config_key(config)} violates a constraint or is not part of "
                f"the space"
            )
        return found

    def __contains__(self, config: object) -> bool:
        if not isinstance(config, Mapping):
            return False
        try:
            self.index(config)
        except SpaceError:
            return False
        return True

    @cached_property
    def encoded(self) -> FloatArray:
        """Every configuration normalised to [0, 1]^d (numbers by scale, categories by order)."""
        columns = [spec.positions()[self.rows[:, j]] for j, spec in enumerate(self.parameters)]
        return np.stack(columns, axis=1)

    @cached_property
    def categorical(self) -> BoolArray:
        """Which columns are categorical (compared by equality, not distance)."""
        return np.array([not p.numeric for p in self.parameters])

    def distances(self, index: int, others: IntArray) -> FloatArray:
        """Distance from one configuration to others: |delta| on numbers, 0/1 on categories."""
        delta = np.abs(self.encoded[others] - self.encoded[index])
        delta[:, self.categorical] = (delta[:, self.categorical] > 0).astype(np.float64)
        return np.asarray(np.sqrt((delta**2).sum(axis=1)))

    def neighbours(self, index: int) -> list[int]:
        """Valid configurations that differ from this one in exactly one parameter."""
        return self._variants(index, steps_only=False)

    def step_neighbours(self, index: int) -> list[int]:
        """Valid configurations one step away in one parameter (any other value of a category)."""
        return self._variants(index, steps_only=True)

    def _variants(self, index: int, steps_only: bool) -> list[int]:
        row = [int(x) for x in self.rows[index]]
        found = []
        for j, spec in enumerate(self.parameters):
            choices: Iterable[int]
            if steps_only and spec.numeric:
                choices = (row[j] - 1, row[j] + 1)
            else:
                choices = range(len(spec.values))
            for value in choices:
                if value == row[j] or not 0 <= value < len(spec.values):
                    continue
                other = self._find((*row[:j], value, *row[j + 1 :]))
                if other is not None:
                    found.append(other)
        return found

    def describe(self) -> str:
        """One line per parameter, for logs and the CLI."""
        lines = [
            f"  {p.name} ({p.type.value}{', log' if p.scale is Scale.LOG else ''}): "
            f"{', '.join(map(str, p.values))}"
            for p in self.parameters
        ]
        lines += [f"  constraint: {c.text}" for c in self.constraints]
        return "\n".join(lines)


def explain_validation_error(error: Exception) -> str:
    """First pydantic error as one line: the field path and its message."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return str(error)
    first = errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg", error)).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
