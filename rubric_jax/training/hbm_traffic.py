"""The HBM bytes a compiled TPU program reads and writes, read from its scheduled HLO (`compiled.as_text()`).

XLA's own `cost_analysis()["bytes accessed"]` is not HBM traffic: it counts every operand and result of every
instruction in any memory, so a weight prefetched into VMEM (`copy-start` into `S(1)`) is counted when it is
copied and again when the matmul reads the copy, and outputs count beside inputs. For a decode step, which is
bound by HBM bandwidth, what matters is what crosses HBM, so this reader counts, per top-level instruction of the
entry computation (and of a `while` body, times its trip count):
- reads: each operand held in HBM (a layout without a memory-space mark `S(n)`, n > 0), whole, except where the
  instruction touches only part of it: an operand that a fusion (or the instruction itself) only slices
  (`slice`, `dynamic-slice`, `gather`) counts the slices' bytes; the buffer a `dynamic-update-slice` or
  `scatter` updates in place counts nothing (its update is read as an operand of its own);
- writes: each result held in HBM, except an in-place update, which writes the update's bytes.
Asynchronous pairs count once, at their start. A custom call (a Pallas kernel) counts its operands whole: an upper
bound for a kernel that skips blocks. Conditionals count their operands only. Tile padding is not counted (the
figures are logical bytes, as the arguments' sizes are).
"""

import dataclasses
import math
import re
from typing import Optional

_ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b(" + "|".join(_ITEM_BYTES) + r")\[([0-9,]*)\](\{[^}]*\})?")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?(%[^ ]+) = (.*?) ([a-z][a-z0-9-]*)\((.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY )?(%[^ ]+) ")
# Instructions that move no data of their own: views, tuple plumbing, the halves of asynchronous pairs that
# wait, and constants (in the program's image).
_FREE = {"parameter", "get-tuple-element", "bitcast", "tuple", "constant", "copy-done", "all-gather-done",
         "all-reduce-done", "collective-permute-done", "send-done", "recv-done", "async-done", "after-all",
         "partition-id", "replica-id", "iota"}
_SLICING = {"slice", "dynamic-slice", "gather"}
_IN_PLACE = {"dynamic-update-slice", "scatter"}


@dataclasses.dataclass(frozen=True)
class _Array:
    bytes: int
    in_hbm: bool
    item_bytes: int = 1


@dataclasses.dataclass(frozen=True)
class _Instruction:
    name: str
    op: str
    results: tuple[_Array, ...]
    operands: tuple[str, ...]
    arguments: str
    attributes: str


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes one run of a program moves between HBM and the chip, per chip."""

    read_bytes: int
    written_bytes: int


def _arrays(type_text: str) -> tuple[_Array, ...]:
    arrays = []
    for dtype, dims, layout in _ARRAY.findall(type_text):
        count = math.prod(int(d) for d in dims.split(",") if d)
        arrays.append(_Array(count * _ITEM_BYTES[dtype], not re.search(r"S\([1-9]", layout or ""), _ITEM_BYTES[dtype]))
    return tuple(arrays)


def _split_call(rest: str) -> tuple[str, str]:
    """(the text inside an instruction's parentheses, the attributes after them)."""
    depth, end = 1, len(rest)
    for i, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            end = i
            break
    return rest[:end], rest[end + 1:]


def _computations(hlo_text: str) -> tuple[dict[str, list[_Instruction]], str]:
    computations: dict[str, list[_Instruction]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        if current is None:
            match = _COMPUTATION.match(line)
            if match and line.rstrip().endswith("{"):
                current = computations.setdefault(match.group(1), [])
                if line.startswith("ENTRY"):
                    entry = match.group(1)
            continue
        if line.startswith("}"):
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if match:
            arguments, attributes = _split_call(match.group(4))
            current.append(_Instruction(match.group(1), match.group(3), _arrays(match.group(2)),
                                        tuple(re.findall(r"%[A-Za-z0-9._-]+", arguments)), arguments, attributes))
    return computations, entry


def _called(attributes: str, key: str) -> Optional[str]:
    match = re.search(key + r"=(%[A-Za-z0-9._-]+)", attributes)
    return match.group(1) if match else None


class _Program:
    def __init__(self, hlo_text: str):
        self.computations, self.entry = _computations(hlo_text)

    def trip_count(self, condition: Optional[str]) -> int:
        """A counted loop's trips: its condition compares the counter with a constant (1 when not found)."""
        instructions = self.computations.get(condition or "", [])
        constants = {i.name: i for i in instructions if i.op == "constant"}
        for instruction in instructions:
            if instruction.op == "compare" and "direction=LT" in instruction.attributes:
                bound = next((constants[o] for o in instruction.operands if o in constants), None)
                if bound is not None and bound.arguments.strip().isdigit():
                    return int(bound.arguments)
        return 1

    def fused_reads(self, fused: str, index: int, whole: int) -> int:
        """Bytes fusion computation `fused` reads of its parameter `index` (`whole` bytes): the slices it takes
        when it only slices it (itself or in the fusions nested in it), nothing when it only updates it in place,
        else all of it."""
        instructions = self.computations.get(fused, [])
        parameters = [i for i in instructions if i.op == "parameter" and i.arguments.strip() == str(index)]
        names = {i.name for i in parameters}
        parameter_item_bytes = parameters[0].results[0].item_bytes if parameters and parameters[0].results else 1
        views = set(names)
        sliced = 0
        for instruction in instructions:
            uses = [k for k, operand in enumerate(instruction.operands) if operand in views]
            if not uses:
                continue
            if instruction.op == "bitcast":
                views.add(instruction.name)
            elif instruction.op == "fusion" and len(uses) == 1:
                sliced += self.fused_reads(_called(instruction.attributes, "calls") or "", uses[0], whole)
            elif instruction.op in _SLICING and uses == [0]:
                sliced += _sliced_bytes(instruction, parameter_item_bytes)
            elif instruction.op in _IN_PLACE and uses == [0]:
                continue
            else:
                return whole
        # A fusion that hands the parameter on (a view of it at its root) reads it whole.
        return whole if instructions and instructions[-1].name in views else sliced

    def in_place_write(self, fused: str) -> Optional[int]:
        """The update's bytes when fusion computation `fused` ends in an in-place update, else None."""
        instructions = self.computations.get(fused, [])
        if not instructions or instructions[-1].op not in _IN_PLACE:
            return None
        results_of = {i.name: i.results for i in instructions}
        return _update_bytes(instructions[-1], results_of)

    def traffic(self, computation: str, results_of: dict[str, tuple[_Array, ...]]) -> tuple[int, int]:
        read = written = 0
        for instruction in self.computations.get(computation, []):
            results_of[instruction.name] = instruction.results
            if instruction.op in _FREE:
                continue
            if instruction.op == "while":
                trips = self.trip_count(_called(instruction.attributes, "condition"))
                body_read, body_written = self.traffic(_called(instruction.attributes, "body") or "", results_of)
                read, written = read + trips * body_read, written + trips * body_written
                continue
            fused = _called(instruction.attributes, "calls") if instruction.op == "fusion" else None
            for index, operand in enumerate(instruction.operands):
                arrays = [a for a in results_of.get(operand, ()) if a.in_hbm]
                whole = sum(a.bytes for a in arrays)
                if not whole:
                    continue
                if fused is not None:
                    read += self.fused_reads(fused, index, whole)
                elif instruction.op in _IN_PLACE and index == 0:
                    continue
                elif instruction.op in _SLICING and index == 0:
                    read += _sliced_bytes(instruction, arrays[0].item_bytes)
                else:
                    read += whole
            if instruction.op.endswith("-start"):
                continue  # its results are where the data lands: written once the pair is done
            if fused is not None:
                update = self.in_place_write(fused)
            else:
                update = _update_bytes(instruction, results_of) if instruction.op in _IN_PLACE else None
            written += update if update is not None else sum(a.bytes for a in instruction.results if a.in_hbm)
        return read, written


def _sliced_bytes(instruction: _Instruction, operand_item_bytes: int) -> int:
    """The bytes a slice reads of its operand: its elements at the operand's width (a fused slice may convert,
    e.g. float32 read into bfloat16)."""
    return sum(a.bytes // a.item_bytes * operand_item_bytes for a in instruction.results)


def _update_bytes(instruction: _Instruction, results_of: dict[str, tuple[_Array, ...]]) -> int:
    """The bytes an in-place update writes: its update operand's (dynamic-update-slice's second, scatter's
    third)."""
    update = instruction.operands[1 if instruction.op == "dynamic-update-slice" else 2]
    return sum(a.bytes for a in results_of.get(update, ()))


def hbm_traffic(hlo_text: str) -> Traffic:
    """The HBM bytes a scheduled, compiled program (`compiled.as_text()`) reads and writes in one run, per chip
    (module docstring)."""
    program = _Program(hlo_text)
    read, written = program.traffic(program.entry, {})
    return Traffic(read, written)
