# fed-auc on CPU: the CPU build of torch (no CUDA packages) and the package with its Flower extra,
# so one image serves both roles (coordinator and hospital node); by default it runs the demo.
#   docker build -t fed-auc . && docker run --rm -v "$PWD/runs:/app/runs" fed-auc
FROM python:3.11-slim

# TORCH_INDEX: where torch comes from. The default is the CPU build. A GPU node builds with a
# CUDA index that its driver supports (nvidia-smi shows the highest CUDA version), e.g.
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 -t fed-auc-gpu .
#   docker run --gpus all ... fed-auc-gpu node --site site/site.toml --device cuda ...
# (the NVIDIA Container Toolkit on the host); hospitals/README.md, "A GPU node".
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 FLWR_TELEMETRY_ENABLED=0 PYTHONUNBUFFERED=1

WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY fed_auc ./fed_auc
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0 \
 && pip install -c constraints.txt ".[flower,privacy]"

COPY hospitals ./hospitals
COPY configs ./configs
# Role switch: the default runs the demo; pass a role to run a service instead. The coordinator
# must listen on all interfaces inside the container (its config binds loopback by default):
#   docker run -v "$PWD/certs:/app/certs" -v "$PWD/runs:/app/runs" -p 9092:9092 fed-auc \
#     coordinator --config configs/flower_demo.toml --address 0.0.0.0:9092
# A hospital node mounts its site file, its images and its key (nothing else leaves the site):
#   docker run -v "$PWD/site:/app/site" -v "$PWD/certs:/app/certs" fed-auc node \
#     --site site/site.toml --coordinator coord.example.org:9092 \
#     --root-certificates certs/ca.pem --auth-key certs/keys/<site>.key
ENTRYPOINT ["fed-auc"]
CMD ["demo", "--runs-dir", "/app/runs"]
