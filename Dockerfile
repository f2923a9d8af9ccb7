# fed-auc on CPU: installs the CPU build of torch (no CUDA packages), the package, runs the demo.
#   docker build -t fed-auc . && docker run --rm -v "$PWD/runs:/app/runs" fed-auc
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 FLWR_TELEMETRY_ENABLED=0 PYTHONUNBUFFERED=1

WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY fed_auc ./fed_auc
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0 \
 && pip install -c constraints.txt .

COPY hospitals ./hospitals
COPY configs ./configs
# Role switch: the default runs the demo; pass a role to run a service instead, e.g.
#   docker run -v "$PWD/certs:/app/certs" -p 9092:9092 fed-auc coordinator --config configs/flower_demo.toml
#   docker run -v "$PWD/certs:/app/certs" fed-auc node --site hospitals/st_elsewhere.toml \
#     --coordinator coord:9092 --root-certificates certs/ca.pem --auth-key certs/keys/st_elsewhere.key
ENTRYPOINT ["fed-auc"]
CMD ["demo", "--runs-dir", "/app/runs"]
