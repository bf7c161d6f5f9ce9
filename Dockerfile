# The gateway image used by compose.yaml (HTTP providers; the engine needs a CUDA base image).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY backends backends
COPY engine engine
COPY migrations migrations
COPY config config
# Editable, so the package finds migrations/ next to it in /app.
RUN pip install --no-cache-dir -e .
EXPOSE 8000
CMD ["switchyard", "serve", "--config", "/app/config/production.yaml"]
