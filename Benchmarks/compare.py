#!/usr/bin/env python3
"""Prints each figure of Benchmarks/BASELINE.md found in benchmark output beside its baseline.

usage: compare.py BASELINE.md OUTPUT...   (OUTPUT: files holding what the benchmarks printed)

A figure that moved more than 5% the wrong way is marked; one not found in the output (its
benchmark was not run, or failed) is listed as such. The exit status is 0 either way: the machine
is noisy, and the figures are for a person to read, in the closing note of the change.
"""
import re
import sys

TOLERANCE = 0.05


def baselines(path):
    rows = []
    for line in open(path, encoding="utf-8"):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("figure", "") or set(cells[0]) <= set("-"):
            continue
        name, baseline, better, _, pattern = cells
        if better not in ("higher", "lower", "zero"):
            raise SystemExit(f"{path}: {name}: better must be higher, lower or zero, not {better!r}")
        rows.append((name, float(baseline), better, re.compile(pattern.strip("`"), re.MULTILINE)))
    return rows


def change(now, baseline, better):
    """The relative change, and whether it is worse than the tolerance."""
    if better == "zero":
        # An error in percent: worse once it grows by 5% and by more than half a point.
        grown = abs(now) - abs(baseline)
        return grown, grown > 0.5 and abs(now) > abs(baseline) * (1 + TOLERANCE)
    if baseline == 0:
        return 0.0, False
    relative = (now - baseline) / baseline
    return relative, (relative < -TOLERANCE if better == "higher" else relative > TOLERANCE)


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    output = "".join(open(path, encoding="utf-8", errors="replace").read() for path in sys.argv[2:])
    rows = baselines(sys.argv[1])
    width = max(len(name) for name, *_ in rows)
    worse_count = missing = 0
    print(f"{'figure'.ljust(width)}  {'now':>10}  {'baseline':>10}  change")
    for name, baseline, better, pattern in rows:
        found = pattern.findall(output)
        if not found:
            missing += 1
            print(f"{name.ljust(width)}  {'-':>10}  {baseline:>10g}  not in this run's output")
            continue
        # A benchmark run twice prints a figure twice: the last one counts.
        value = found[-1] if isinstance(found[-1], str) else found[-1][0]
        now = float(value.replace(",", ""))
        moved, worse = change(now, baseline, better)
        shown = f"{moved:+.2f} points" if better == "zero" else f"{moved * 100:+.1f}%"
        mark = "  WORSE by more than 5%" if worse else ""
        worse_count += worse
        print(f"{name.ljust(width)}  {now:>10g}  {baseline:>10g}  {shown}{mark}")
    print(f"{len(rows) - missing} figures compared, {worse_count} worse than the baseline by more than 5%, {missing} not measured")


if __name__ == "__main__":
    main()
