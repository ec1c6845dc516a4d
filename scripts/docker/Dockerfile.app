# The Python side (producer, Redis loader, trainer): the rtrec package and its dependencies.
FROM python:3.11.11-slim-bookworm
WORKDIR /opt/rtrec
COPY requirements/ requirements/
RUN pip install --no-cache-dir -r requirements/runtime.txt
COPY pyproject.toml README.md ./
COPY rtrec/ rtrec/
COPY schemas/ schemas/
COPY feature_store/ feature_store/
COPY gpu_trainer/ gpu_trainer/
COPY flink_jobs/ flink_jobs/
ENV PYTHONPATH=/opt/rtrec
