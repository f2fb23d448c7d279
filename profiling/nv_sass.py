#!/usr/bin/env python3
"""NVIDIA machine code (SASS) of kiln's kernels, as the Vulkan driver compiled them.

    KILN_DUMP_WGSL=/tmp/w kiln bench -m model.gguf -p 512 -n 16 -r 1
    pipeline_stats /tmp/w --cache-blobs /tmp/blobs > /tmp/stats.txt   # examples/pipeline_stats.rs
    python3 profiling/nv_sass.py /tmp/blobs /tmp/stats.txt /tmp/sass

Needs `zstd` (the driver's pipeline-cache data is a header and a zstd frame) and CUDA's
`nvdisasm`. The decompressed data is the driver's own container; the kernel's code is the
`Binary Size` bytes (from pipeline_stats' line) that end with the last run of NOPs, which
`nvdisasm -b SM90` reads as raw instructions. Found by inspection on driver 580.159.04 (H200):
another driver may lay its cache out differently, and then this finds nothing (it says so).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

NOP = bytes.fromhex("1879000000000000")  # the low word of SM90's NOP
ZSTD_MAGIC = bytes.fromhex("28b52ffd")


def file_stem(label):
    return "".join(c if (c.isalnum() or c in "-_.") else "_" for c in label)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    blobs, stats, out = sys.argv[1:]
    zstd = shutil.which("zstd")
    nvdisasm = shutil.which("nvdisasm") or next(iter(glob.glob("/usr/local/cuda*/bin/nvdisasm")), None)
    if not zstd or not nvdisasm:
        sys.exit(f"needs zstd ({zstd}) and nvdisasm ({nvdisasm})")
    os.makedirs(out, exist_ok=True)
    sizes = {}
    for line in open(stats):
        m = re.search(r"Binary Size=(\d+)", line)
        if m:
            sizes[line.split(" wg=")[0]] = int(m.group(1))
    done = 0
    for label, size in sizes.items():
        blob = os.path.join(blobs, file_stem(label) + ".cache")
        if not os.path.exists(blob):
            continue
        data = open(blob, "rb").read()
        start = data.find(ZSTD_MAGIC)
        if start < 0:
            print(f"{label}: no zstd frame in {blob}")
            continue
        raw = subprocess.run([zstd, "-q", "-d", "-c"], input=data[start:], capture_output=True).stdout
        end = raw.rfind(NOP)
        if end < 0 or end + 16 < size:
            print(f"{label}: no code found")
            continue
        code = raw[end + 16 - size : end + 16]
        path = os.path.join(out, file_stem(label))
        open(path + ".bin", "wb").write(code)
        sass = subprocess.run([nvdisasm, "-b", "SM90", path + ".bin"], capture_output=True, text=True)
        open(path + ".sass", "w").write(sass.stdout + sass.stderr)
        done += 1
    print(f"{done} of {len(sizes)} kernels disassembled into {out}")


if __name__ == "__main__":
    main()
