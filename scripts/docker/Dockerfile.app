# The Python services (producer, Redis loader, trainer, `rtrec model`): the rtrec code and the locked
# requirements/app.txt in a venv. The venv is built in its own stage, so pip's caches and build
# leftovers stay out of the image; torch from PyPI brings the CUDA libraries (most of the size).
FROM python:3.11.11-slim-bookworm AS venv
# pip inside a venv trusts certifi's bundle only; the system's also holds a site's own CA, if any.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements/app.txt /tmp/app.txt
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps --require-hashes -r /tmp/app.txt \
    && find /opt/venv -name __pycache__ -prune -exec rm -rf {} +

FROM python:3.11.11-slim-bookworm
COPY --from=venv /opt/venv /opt/venv
WORKDIR /opt/rtrec
COPY pyproject.toml ./
COPY core/ core/
COPY rtrec/ rtrec/
COPY schemas/ schemas/
COPY feature_store/ feature_store/
COPY gpu_trainer/ gpu_trainer/
# Snapshots go to a bind mount of the host's .compose-data/snapshots (so `scripts/rtrec model score` on
# the host reads them); the services run as the host user that owns it (RTREC_UID/RTREC_GID in compose).
RUN mkdir -p /data/snapshots && chmod 1777 /data /data/snapshots
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/opt/rtrec PYTHONUNBUFFERED=1 HOME=/tmp \
    XDG_CACHE_HOME=/tmp/cache RTREC_TRAINER__SNAPSHOT_DIR=/data/snapshots \
    RTREC_SERVICES__METRICS_HOST=0.0.0.0
USER 1000:1000
ENTRYPOINT ["python", "-m", "rtrec"]
CMD ["--help"]
