"""Print one line summarising an `nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used
--format=csv,noheader,nounits -l 1` log (mean and max utilisation, max memory); nothing if the log is
missing or empty. Used by the GPU recipes here: python3 scripts/device/gpu_util_summary.py OUT/gpu_util.csv"""

from __future__ import annotations

import sys
from pathlib import Path


def main(path: str) -> None:
    util = Path(path)
    if not util.is_file():
        return
    vals = [line.split(",") for line in util.read_text().splitlines() if line.count(",") == 2]
    u = [float(v[1]) for v in vals if v[1].strip().replace(".", "").isdigit()]
    m = [float(v[2]) for v in vals if v[2].strip().replace(".", "").isdigit()]
    if u:
        print(f"GPU over the whole recipe: utilisation mean {sum(u) / len(u):.0f}% max {max(u):.0f}%, "
              f"memory max {max(m):.0f} MiB ({len(u)} samples)")


if __name__ == "__main__":
    main(sys.argv[1])
