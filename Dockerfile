# Switchyard image: the gateway, and the engine node (`switchyard engine serve`).
#   docker build -t switchyard:cpu .                          # torch CPU wheels + g++ (gateway, CPU engine)
#   docker build -t switchyard:cuda --build-arg VARIANT=cuda .  # torch CUDA wheels + a C compiler for Triton
# The CUDA wheels bundle the CUDA runtime; the host needs only the NVIDIA driver and container toolkit.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG VARIANT=cpu
# Keep TORCH_VERSION equal to the torch pin in pyproject.toml (tests/deploy checks it).
ARG TORCH_VERSION=2.13.0
ARG CUDA_INDEX=https://download.pytorch.org/whl/cu128
ARG CPU_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN case "$VARIANT" in \
      cpu)  pip install "torch==${TORCH_VERSION}" --index-url "$CPU_INDEX" ;; \
      cuda) pip install "torch==${TORCH_VERSION}" --index-url "$CUDA_INDEX" ;; \
      *) echo "VARIANT must be cpu or cuda, got $VARIANT" >&2; exit 2 ;; \
    esac
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backends backends
COPY engine engine
COPY migrations migrations
COPY config config
# Editable, so the package finds migrations/ next to it in /app (the same path in the runtime stage).
RUN pip install -e .

FROM ${PYTHON_IMAGE} AS runtime
ARG VARIANT=cpu
# Triton compiles its kernel launchers with the system C compiler at run time; on the CPU the
# engine builds its C++ decode attention once (engine/cpu_kernels, into SWITCHYARD_KERNEL_CACHE).
RUN if [ "$VARIANT" = "cuda" ]; then compilers="gcc libc6-dev"; else compilers="g++"; fi \
 && apt-get update && apt-get install -y --no-install-recommends $compilers && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 switchyard \
 && useradd --system --uid 10001 --gid switchyard --home-dir /home/switchyard --create-home switchyard \
 && mkdir -p /var/lib/switchyard /app/var && chown switchyard:switchyard /var/lib/switchyard /app/var
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 HF_HOME=/home/switchyard/.cache/huggingface \
    SWITCHYARD_KERNEL_CACHE=/var/lib/switchyard/cpu_kernels
WORKDIR /app
USER switchyard
EXPOSE 8000 8100
CMD ["switchyard", "serve", "--config", "/app/config/default.yaml"]
