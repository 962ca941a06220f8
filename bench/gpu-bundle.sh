#!/usr/bin/env bash
# A vLLM release for the device machine, as chunks that bench/device.sh carries one per call.
#
#   bench/gpu-bundle.sh RELEASE [OUTDIR]      here (pip download works here, not there)
#
# The device has Python 3.12, torch 2.11.0+cu130 in /opt/torch/.venv (cuda-toolkit 13.0.2, cuDNN
# 9.19, NCCL 2.28.9, triton 3.6) and no network. This installs vLLM RELEASE (trimmed: no
# FlashAttention 2, no Rust front end, no DeepGEMM builds for other Pythons) and every wheel
# bench/gpu-bundle/requirements-RELEASE.txt lists into one site directory here, packs it as one
# xz stream (xz -0 packs torch's libraries about 30 % smaller than zip's deflate) and cuts it into
# OUTDIR/chunk1..N (default .gpu/bundle), each small enough that it plus the working tree fits
# the 64 MiB a call carries (the tree is measured here: `git ls-files`; CHUNK_MIB overrides).
# The last chunk also holds install.sh and bundle.json (release, versions, digest, pieces).
# On the device the site directory goes to /tmp/site, ahead of the venv on PYTHONPATH, and
# bench/gpu_bundle_check.py must pass (torch, triton and vLLM import at the bundle's versions,
# NCCL loads, a CUDA matmul and a Triton kernel give the CPU's answer) before any run.
#
# What travels for 0.32.0 and why (torch 2.13.0's Requires-Dist against the device's venv):
#   torch 2.13.0, triton 3.7.1 (torch's exact pin), torchvision 0.28.0 (the device's 0.26 is built
#     against torch 2.11 and fails to register its operators under 2.13);
#   NCCL: libtorch_cuda.so 2.13.0 imports 46 NCCL symbols and 2.28.9 lacks eight of them
#     (ncclCommMemStats, ncclCommSuspend/Resume, ncclPutSignal, ncclSignal, ncclWaitSignal,
#     ncclGetPeerDevicePointer, ncclGetLsaMultimemDevicePointer: absent from NCCL v2.28.9's
#     source), and Python loads extensions with RTLD_NOW, so `import torch` would fail. The pinned
#     2.29.7 is not on this project's registry; 2.32.3 is, keeps libnccl.so.2's ABI and exports
#     all 46. Only lib/libnccl.so.2 travels (its headers and LTO device code serve NCCL's device
#     API, which vLLM does not build).
# What stays on the device, checked symbol by symbol against the libraries the pins name:
#   cuda-toolkit 13.0.2 vs 13.0.3: every component torch uses has the same version except cuBLAS
#     (13.1.0.3 vs 13.1.1.3), and cuBLAS 13.1.0.3 exports all 177 cuBLAS symbols torch 2.13 imports;
#   cuDNN 9.19 vs 9.20: 9.19's libcudnn.so.9 exports all 84 symbols torch imports. torch's own
#     Python check refuses a runtime minor below the compiled one, so torch.backends.cudnn.version()
#     raises there: only convolutions, RNNs and vLLM's Blackwell-only ViT FP8 path call it, none of
#     them on a text model on Hopper (the check script prints what torch says);
#   cuSPARSELt 0.8.0 vs 0.8.1: 0.8.0 exports all 16 symbols torch imports; NVSHMEM 3.4.5: the same pin.
#
# Device calls. For 0.32.0 (run here on 2026-12-05 at XZ_LEVEL 0, tree 14 MiB, Triton's AMD
# backend kept: 10 min at load 4-7, the wheels already downloaded): 23 chunks, 22 of 46.0 MiB
# and one of 36.7 MiB, 1,099,616,696 bytes of xz in all (sha256 46e25468…; the site directory
# is 2.9 GiB); .gpu/ctx, if a run needs it, travels with the last:
#   run(carry=[".gpu/bundle/chunk1"]): bash bench/device.sh stash chunk1
#   run(carry=[".gpu/bundle/chunk2"]): bash bench/device.sh stash chunk2
#   ...                                 (one call per chunk, up to chunk22)
#   run(carry=[".gpu/bundle/chunk23", ".gpu/ctx"]): bash bench/device.sh install &&
#       bash bench/device.sh start NAME -- python3 ... && bash bench/device.sh collect 540
# Every chunk must be stashed on the same machine (it keeps nothing between leases): if the
# lease lapses midway, start again from chunk1; install says how many pieces it found.
# `install` stashes the chunk it is carried with, joins the pieces, checks their digest,
# unpacks to /tmp/site and runs bench/gpu_bundle_check.py; it stops the call when any fails.
set -euo pipefail
release=${1:?usage: bench/gpu-bundle.sh RELEASE [OUTDIR]}
out=${2:-.gpu/bundle}
here=$(cd "$(dirname "$0")" && pwd)
req=$here/gpu-bundle/requirements-$release.txt
if [ ! -f "$req" ]; then
  echo "gpu-bundle.sh: no $req; releases with a list: $(cd "$here/gpu-bundle" && ls requirements-*.txt | sed 's/requirements-//; s/\.txt//' | tr '\n' ' ')" >&2
  exit 2
fi
py=${PYTHON:-python3}
work=${GPU_BUNDLE_WORK:-.gpu/work-$release}
mkdir -p "$work/whl"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
export PIP_CONSTRAINT=
# Kept in $work between runs: pip downloads only what is missing.
if ! "$py" -m pip download -q --no-deps "${plat[@]}" -d "$work/whl" "vllm==$release" -r "$req"; then
  echo "gpu-bundle.sh: pip could not download every wheel of $req (its error above): no bundle" >&2
  exit 3
fi

# The wheels named (one file per line of the list, the vLLM wheel first).
wheels=$("$py" - "$work/whl" "$release" "$req" <<'PY'
import pathlib, re, sys
from packaging.utils import canonicalize_name, parse_wheel_filename
whl, release, req = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
want = {"vllm": release}
for line in open(req):
    line = line.split("#", 1)[0].strip()
    if line:
        name, version = re.split(r"==", line, maxsplit=1)
        want[canonicalize_name(name)] = version.strip()
found = {}
for w in whl.glob("*.whl"):
    name, version, *_ = parse_wheel_filename(w.name)
    if want.get(name) == str(version):
        found[name] = w
missing = sorted(set(want) - set(found))
if missing:
    sys.exit(f"gpu-bundle.sh: downloaded no wheel for {missing}")
print("\n".join(str(found[n]) for n in want))
PY
)
# What the site directory and its packed stream are made from: the wheels and this script (its
# trims). Keyed on the wheels alone, the AMD-backend fix below reused the site trimmed before it
# and packed the same stream again (2026-12-05: bundle.json unchanged, TritonMissing again).
recipe=$(printf '%s\nscript %s' "$wheels" "$(sha256sum "$0" | cut -d' ' -f1)")
stage=$work/site
# A site directory installed from these very wheels by this very script is kept (installing
# takes minutes).
if [ "$(cat "$stage/.wheels" 2>/dev/null)" != "$recipe" ]; then
  rm -rf "$stage"
  # shellcheck disable=SC2086  # one wheel path per word
  "$py" -m pip install -q --no-deps --no-index --no-compile "${plat[@]}" --target "$stage" $wheels
  # Trims: what a dense or MoE model on Hopper under Python 3.12 never loads. Triton's AMD
  # backend stays (2.7 MB): from 3.7, `import triton` reaches it through gluon, and without it
  # torch finds no Triton at all (seen on the H200, 2026-12-05: TritonMissing).
  rm -rf "$stage/bin" "$stage/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$stage/vllm/vllm-rs" \
         "$stage"/vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-x86_64-linux-gnu.so \
         "$stage/nvidia/nccl/include" "$stage/nvidia/nccl/lib/libnccl_device.bc" \
         "$stage/nvidia/nccl/lib/libnccl_device.ltoir"
  printf '%s' "$recipe" > "$stage/.wheels"
fi
xzfile=$work/site.tar.xz
# A stream packed whole from this site directory is kept too (packing takes half an hour on a
# busy 2-core machine); .packed holds the recipe it was packed from.
if [ "$(cat "$xzfile.packed" 2>/dev/null)" != "$recipe" ] || [ ! -f "$xzfile" ]; then
  rm -f "$xzfile.packed"
  # XZ_LEVEL 0 packs torch's libraries 5x faster than 3 for 7 % more bytes (30 MiB of
  # libtorch_cuda.so here: 4.8 MiB in 7 s at 0, 4.5 MiB in 36 s at 3; gzip -6 6.8 MiB).
  tar -C "$stage" --sort=name --exclude=./.wheels -cf - . | xz -T"${XZ_THREADS:-2}" -"${XZ_LEVEL:-0}" > "$xzfile"
  printf '%s' "$recipe" > "$xzfile.packed"
fi

# What travels is what the working tree holds: a tracked file deleted there (set aside to make
# room for bigger chunks) does not, and du's complaint about it is not an error.
tree_bytes=$( (git ls-files -z | xargs -0 du -cb 2>/dev/null || true) | tail -1 | cut -f1)
# 64 MiB a call, less the tree and 4 MiB for what the tree gains before the lead runs it.
mib=${CHUNK_MIB:-$(( (64 * 1048576 - tree_bytes) / 1048576 - 4 ))}
rm -rf "$out"/chunk* && mkdir -p "$out"
split -b "${mib}M" -d -a 2 "$xzfile" "$work/site.tar.xz."
pieces=("$work"/site.tar.xz.[0-9][0-9])
n=${#pieces[@]}
for i in $(seq 1 "$n"); do
  mkdir -p "$out/chunk$i" && mv "${pieces[$((i - 1))]}" "$out/chunk$i/" && : > "$out/chunk$i/CHUNK"
done
cp "$here/gpu-bundle/install.sh" "$out/chunk$n/"
"$py" - "$stage" "$xzfile" "$release" "$n" "$mib" "$tree_bytes" > "$out/chunk$n/bundle.json" <<'PY'
import hashlib, importlib.metadata as md, json, os, sys
stage, xzfile, release, n, mib, tree = sys.argv[1:]
h = hashlib.sha256()
with open(xzfile, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
dists = {d.metadata["Name"].lower(): d.version for d in md.distributions(path=[stage])}
doc = {"release": release, "pieces": int(n), "chunk_mib": int(mib), "tree_bytes": int(tree),
       "sha256": h.hexdigest(), "bytes": os.path.getsize(xzfile),
       "versions": {k: dists[k] for k in ("vllm", "torch", "triton", "nvidia-nccl-cu13") if k in dists}}
print(json.dumps(doc, indent=1, sort_keys=True))
PY
echo "gpu-bundle.sh: vLLM $release in $n chunks of at most $mib MiB (tree $((tree_bytes >> 20)) MiB):"
du -sb "$out"/chunk* | awk '{printf "  %s %.1f MiB\n", $2, $1 / 1048576}'
