#!/usr/bin/env bash
# Build the trimmed simulator bundle that travels to a GPU machine (see scripts/device/README.md).
#
#   bash scripts/device/build_sims_bundle.sh            # cp312 bundle into .gpu/ (for the device's Python 3.12)
#   PYTAG=311 OUT_DIR=/tmp/b311 bash scripts/device/build_sims_bundle.sh   # same trim, binaries from .venv (local check)
#
# Pure-Python packages and assets are copied from the project venv (.venv, made by scripts/setup.sh with
# ROBO_RL_EXTRAS including maniskill and libero), so their versions are the pinned ones. The compiled ones
# (sapien, mujoco) come as cp$PYTAG wheels from PyPI, or from .venv when PYTAG matches its Python.
# Output: $OUT_DIR/sims-{common,maniskill,libero}-cp$PYTAG.tar.xz, each unpacking to site-packages layout.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTAG=${PYTAG:-312}
OUT_DIR=${OUT_DIR:-.gpu}
VENV=${VENV:-.venv}
WHEELS=${WHEELS:-/tmp/robo-rl-wheels-cp$PYTAG}
SITE=$(echo "$VENV"/lib/python3.*/site-packages)
STAGE=$(mktemp -d /tmp/sims-bundle.XXXX)
trap 'rm -rf "$STAGE"' EXIT

# 1. compiled packages: sapien, mujoco
BIN=$STAGE/bin
mkdir -p "$BIN"
if [ "$PYTAG" = "$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')" ]; then
  cp -a "$SITE"/{sapien,sapien.libs,sapien-3.0.3.dist-info,mujoco,mujoco-3.8.1.dist-info} "$BIN"/
else
  mkdir -p "$WHEELS"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTAG" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WHEELS" sapien==3.0.3 mujoco==3.8.1 2>&1 | grep -v "is ignored" || true
  for w in "$WHEELS"/sapien-3.0.3-cp$PYTAG-*.whl "$WHEELS"/mujoco-3.8.1-cp$PYTAG-*.whl; do
    python3 -m zipfile -e "$w" "$BIN"/
  done
fi

# OIDN (SAPIEN's ray-tracing denoiser) is 17 MB of network weights that rasterized rendering never uses, but
# libsvulkan2.so links libOpenImageDenoise.so.2: replace both OIDN libraries by a stub exporting the same C API
# (every call returns 0/NULL, i.e. "no device"), so SAPIEN loads and the denoiser is simply unavailable.
OIDN=$BIN/sapien/oidn_library
nm -D --defined-only "$OIDN/libOpenImageDenoise.so.2.0.1" | awk '$2 == "T" && $3 ~ /^oidn/ {print "void *" $3 "(void) { return 0; }"}' > "$STAGE/oidn_stub.c"
rm -f "$OIDN"/libOpenImageDenoise*
gcc -shared -fPIC -O1 -Wl,-soname,libOpenImageDenoise.so.2 -o "$OIDN/libOpenImageDenoise.so.2.0.1" "$STAGE/oidn_stub.c"
gcc -shared -fPIC -O1 -Wl,-soname,libOpenImageDenoise_core.so.2 -o "$OIDN/libOpenImageDenoise_core.so.2.0.1" -x c /dev/null

# 2. assemble the three trees with a small Python helper (explicit keep rules, easier to read than tar excludes)
"$VENV/bin/python" - "$SITE" "$BIN" "$STAGE" scripts/device/libero_spatial0_assets.txt <<'EOF'
import fnmatch, os, shutil, sys
from pathlib import Path

site, binsrc, stage, libero_list = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
DATA = (".glb", ".gltf", ".obj", ".stl", ".dae", ".ply", ".msh", ".png", ".jpg", ".jpeg", ".hdr", ".exr",
        ".ktx", ".mtl", ".npy", ".npz", ".pkl", ".pt", ".h5", ".hdf5", ".ttf", ".mp4", ".zip", ".bin")

def copy(src_root, rel, dst, keep=lambda r: True):
    src = src_root / rel
    for p in ([src] if src.is_file() else sorted(src.rglob("*"))):
        r = p.relative_to(src_root).as_posix()
        if p.is_dir() or "__pycache__" in r or not keep(r):
            continue
        out = dst / r
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p.resolve(), out)

def dists(*names):
    return [d.name for d in site.glob("*.dist-info") if d.name.split("-")[0].lower() in names]

def tree(name, parts):
    dst = stage / "trees" / name
    for root, rel, keep in parts:
        copy(root, rel, dst, keep)
    return dst

everything = lambda r: True
common = tree("common", [(binsrc, "mujoco", everything), (binsrc, "mujoco-3.8.1.dist-info", everything)]
              + [(site, p, lambda r: "/Tests" not in r) for p in ["gymnasium", "farama_notifications", "OpenGL"]]
              + [(site, d, everything) for d in dists("gymnasium", "farama_notifications", "pyopengl")])

# sapien: no C++ headers, no macOS libvulkan, no stereo-depth sensor patterns (only StereoDepthCamera reads them)
SAPIEN_DROP = ("sapien/include/", "sapien/vulkan_library/libvulkan.1.3.290.dylib", "sapien/sensor/assets/",
               "sapien/example/")
# ManiSkill: code, plus only what PickCube-v1/PushCube-v1 with the Panda load (robot, table, textures)
MS_KEEP = ("mani_skill/assets/robots/panda/panda_v2.*", "mani_skill/assets/robots/panda/franka_description/*",
           "mani_skill/assets/partnet_mobility/meta/*", "mani_skill/utils/scene_builder/table/assets/table.glb",
           "mani_skill/utils/building/assets/grid_texture.png")
def ms_keep(r):
    if any(fnmatch.fnmatch(r, k) for k in MS_KEEP):
        return True
    return not r.startswith("mani_skill/assets/") and not r.endswith(DATA) and not r.endswith("ProcTHOR.json")
maniskill = tree("maniskill", [(binsrc, "sapien", lambda r: not r.startswith(SAPIEN_DROP)), (binsrc, "sapien.libs", everything),
                               (binsrc, "sapien-3.0.3.dist-info", everything), (site, "mani_skill", ms_keep)]
                 + [(site, p, lambda r: "/tests/" not in r) for p in ["transforms3d", "dacite", "trimesh", "pytorch_kinematics",
                                                    "arm_pytorch_utilities", "pytorch_seed", "IPython", "traitlets", "defusedxml"]]
                 + [(site, d, everything) for d in dists("mani_skill", "transforms3d", "dacite", "trimesh", "ipython", "defusedxml",
                                                         "traitlets", "pytorch_kinematics", "arm_pytorch_utilities",
                                                         "pytorch_seed")])

# LIBERO: code + BDDL files + libero_spatial init states + the assets libero_spatial task 0 opens (list made
# by tracing the files MuJoCo opens; regenerate it when the task changes)
assets = [l.strip() for l in libero_list.read_text().splitlines() if l.strip() and not l.startswith("#")]
def libero_keep(r):
    return ((not r.startswith("libero/libero/init_files/") or r.startswith("libero/libero/init_files/libero_spatial/"))
            and not r.startswith("libero/libero/assets"))
def robosuite_keep(r):
    return not r.startswith("robosuite/models/assets/") or (r.endswith(".xml") and "/bullet_data/" not in r
                                                           and "/demonstrations/" not in r)
libero = tree("libero", [(site, "libero", libero_keep), (site, "robosuite", robosuite_keep)]
              + [(site, p, everything) for p in ["bddl", "easydict", "termcolor", "future", "past"]]
              + [(site, a, everything) for a in assets]
              + [(site, d, everything) for d in dists("libero", "robosuite", "bddl", "easydict", "termcolor", "future")])
for name in ("common", "maniskill", "libero"):
    n = sum(1 for p in (stage / "trees" / name).rglob("*") if p.is_file())
    b = sum(p.stat().st_size for p in (stage / "trees" / name).rglob("*") if p.is_file())
    print(f"{name:10s} {n:6d} files {b / 2**20:7.1f} MiB unpacked")
EOF

# 3. compress (xz -9e, multi-threaded; deterministic order and owners)
mkdir -p "$OUT_DIR"
for name in common maniskill libero; do
  tar -C "$STAGE/trees/$name" --sort=name --owner=0 --group=0 --numeric-owner -cf - . \
    | xz -9e -T0 > "$OUT_DIR/sims-$name-cp$PYTAG.tar.xz"
done
# 4. Debian X client libraries (SAPIEN's libsvulkan2 links libX11): unpacked beside, only if the image lacks them
mkdir -p "$OUT_DIR/xlibs" /tmp/amd64/partial
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
ls /tmp/amd64/*Packages* >/dev/null 2>&1 || apt-get $o update >/dev/null
(cd "$OUT_DIR/xlibs" && apt-get $o download libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 >/dev/null 2>&1)
ls -l "$OUT_DIR"/sims-*-cp$PYTAG.tar.xz "$OUT_DIR"/xlibs
du -ch "$OUT_DIR"/sims-*-cp$PYTAG.tar.xz | tail -1
