# SPDX-License-Identifier: Apache-2.0
# The otel-gpu agent image. Build it with scripts/image.sh: it fetches the CUDA headers and the wheels (dependencies,
# the build system's setuptools) on the host (so the build itself needs no Python package index) and stages the build
# context: the package sources, cuda-include/ and wheelhouse/. With Docker: `IMAGE=otel-gpu:0.1.0 scripts/image.sh build` prepares
# .cache/image-context, then `docker build --build-arg BASE_IMAGE=debian:bookworm-slim -f Dockerfile .cache/image-context`.
# The build stage compiles the eBPF objects (clang, CO-RE, vmlinux.h from the build machine's BTF), the CUDA
# injection library, the span context table and the span processor's C hooks (a CPython extension against the limited
# API, so it loads in the runtime stage's python3), the unwind-table builder and the ELF symbol-table reader (gcc),
# builds the package's wheel (in pip's isolated build environment, with the setuptools from wheelhouse/ that
# pyproject.toml's build system asks for: Debian's is too old) and installs it with its dependencies into a virtual
# environment that has neither pip nor setuptools; the runtime stage is Debian with python3, libbpf1, libelf1 and
# binutils (c++filt: the agent's one C++ and Rust demangler, run in its own process), that environment, and the
# injection library at /opt/otel-gpu/lib/libotel_gpu_inject.so (the Helm chart's init container copies it to the node).
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev \
      systemtap-sdt-dev gcc libc6-dev make python3 python3-dev python3-venv python3-pip >/dev/null
WORKDIR /src
COPY cuda-include /cuda/include
COPY wheelhouse /wheelhouse
COPY pyproject.toml setup.py README.md LICENSE ./
COPY otel_gpu ./otel_gpu
# vmlinux.h comes from the build machine's /sys/kernel/btf/vmlinux; the objects are CO-RE and load on other kernels
RUN make -s -C otel_gpu/ebpf \
 && make -s -C otel_gpu/cuda/native CUDA_INCLUDE=/cuda/include \
 && make -s -C otel_gpu/instrumentation/native \
 && make -s -C otel_gpu/unwind/native \
 && make -s -C otel_gpu/symbolize/native \
 && python3 -m pip wheel -q --no-deps --no-index --find-links /wheelhouse -w /dist . \
 && python3 -m venv --without-pip /opt/otel-gpu/venv \
 && python3 -m pip --python /opt/otel-gpu/venv/bin/python install -q --no-index --find-links /wheelhouse \
      /dist/otel_gpu-*.whl \
 && mkdir -p /opt/otel-gpu/lib \
 && cp otel_gpu/cuda/native/libotel_gpu_inject.so /opt/otel-gpu/lib/ \
 && find /opt/otel-gpu/venv -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 libbpf1 libelf1 binutils >/dev/null \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/*
COPY --from=build /opt/otel-gpu /opt/otel-gpu
ENV PATH=/opt/otel-gpu/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    OTEL_GPU_OUTPUT_DIR=/var/lib/otel-gpu
LABEL org.opencontainers.image.title="otel-gpu" \
      org.opencontainers.image.description="OpenTelemetry-native continuous profiler and metrics agent for NVIDIA GPU machines" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["otel-gpu"]
CMD ["run"]
