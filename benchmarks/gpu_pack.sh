#!/bin/bash
# Packs TensorFlow 2.21 with the CUDA 12 libraries it loads, Keras, nbval and Jupyter for a GPU machine
# that has Python 3.12 but no internet access and no TensorFlow (docs/gpu-runs.md). Run it where pip can
# download; it writes .gpu00/part ... .gpuNN/part (at most 56 MiB each; git-ignored through
# .git/info/exclude) and puts a zstd binary beside the last part. Copy every part to /tmp/parts on the GPU
# machine (/tmp/parts/00, /tmp/parts/01, ...); benchmarks/gpu_session.sh then unpacks and runs.
set -euo pipefail
work=${1:-/tmp/gpu-pack}
mkdir -p "$work/wheels" && cd "$(git rev-parse --show-toplevel)"
grep -qx '/.gpu\*/' .git/info/exclude 2>/dev/null || echo '/.gpu*/' >> .git/info/exclude
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64
           --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
# the oldest CUDA 12 wheels TensorFlow 2.21 accepts are the smallest; cuFFT, cuSPARSE and cuSOLVER become stand-ins
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$work/wheels" tensorflow==2.21.0 keras==3.15.1 numpy==2.4.6 h5py==3.14.0 ml_dtypes==0.6.0 protobuf==7.36.2 \
  optree namex flatbuffers astunparse gast google_pasta termcolor \
  nvidia-cublas-cu12==12.5.3.2 nvidia-cudnn-cu12==9.3.0.75 nvidia-cuda-runtime-cu12==12.5.82 \
  nvidia-cuda-nvrtc-cu12==12.5.82 nvidia-cuda-cupti-cu12==12.5.82 \
  nbval nbformat nbclient jupyter_client jupyter_core ipykernel ipython ipython_pygments_lexers traitlets pyzmq \
  tornado comm matplotlib-inline jedi parso prompt_toolkit pexpect ptyprocess stack_data asttokens executing \
  pure_eval wcwidth fastjsonschema jsonschema jsonschema-specifications referencing rpds-py platformdirs \
  ipywidgets widgetsnbextension jupyterlab_widgets nest-asyncio2
rm -rf "$work/site" && mkdir "$work/site"
for wheel in "$work"/wheels/*.whl; do unzip -q -o "$wheel" -d "$work/site"; done
cd "$work/site"
rm -rf tensorflow/include nvidia/*/include nvidia/cudnn/lib/libcudnn_adv.so.* nvidia/cublas/lib/libnvblas.so.*
find . -name '*.a' -delete
echo 'int mgpu_edu_stand_in(void) { return 0; }' > /tmp/stand_in.c
for library in cufft:libcufft.so.11 cusparse:libcusparse.so.12 cusolver:libcusolver.so.11; do
  mkdir -p "nvidia/${library%%:*}/lib"
  gcc -shared -fPIC -o "nvidia/${library%%:*}/lib/${library##*:}" -Wl,-soname,"${library##*:}" /tmp/stand_in.c
done
cd - >/dev/null
tar cf - -C "$work" site | zstd -q -12 --long=27 -T0 -f -o "$work/site.tar.zst"
# a call carries at most 64 MiB with the tracked files: leave them, zstd and 2 MiB of room
tracked=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
part_bytes=$(( (64 * 1048576 - tracked - 2 * 1048576) / 1048576 * 1048576 ))
rm -rf .gpu[0-9]* && split -b "$part_bytes" -d -a 2 "$work/site.tar.zst" "$work/part."
for part in "$work"/part.*; do mkdir -p ".gpu${part##*.}" && mv "$part" ".gpu${part##*.}/part"; done
last=$(ls -d .gpu[0-9]* | tail -1)
cp "$(command -v zstd)" "$last/"
for lib in libz.so.1 liblzma.so.5 liblz4.so.1; do cp "$(ldconfig -p | awk -v l=$lib '$1 == l {print $NF; exit}')" "$last/"; done
ls -d .gpu[0-9]* | wc -l | xargs echo "parts:"
