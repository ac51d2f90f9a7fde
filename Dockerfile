# syntax=docker/dockerfile:1
# An image that runs `python -m experiments` (train, cluster tasks, tune...):
# the image of a Vertex AI job's containerSpec (submit --container-image), of
# a Kubeflow TFJob (submit --target tfjob --container-image) or, for the
# keras3 engine, of a JAXJob (submit --target jaxjob --engine keras3).
#
# Build arguments:
#   STACK   estimator (default): TensorFlow 2.15 + tf.estimator, both engines
#           keras: TensorFlow 2.21 + tf-keras, the keras engine
#           keras3: TensorFlow 2.21 + Keras 3 + JAX (extras cpu,jax), the keras3
#           engine on KERAS_BACKEND jax or tensorflow; needs PYTHON_VERSION 3.12+
#   DEVICE  cpu (default) or gpu (the CUDA wheels TensorFlow installs from pip;
#           for keras3, JAX's CUDA 12 wheels, TensorFlow on the CPU feeding data)
#   PYTHON_VERSION  3.11 (default: TensorFlow 2.15's newest), 3.12 or 3.13
#
#   docker build -t estimator-keras:cpu .
#   docker build --build-arg STACK=keras --build-arg DEVICE=gpu -t estimator-keras:keras-gpu .
#   docker build --build-arg STACK=keras3 --build-arg PYTHON_VERSION=3.13 \
#       -t estimator-keras:keras3 .
#   docker run --rm estimator-keras:cpu train fashion_mnist_mlp --max-steps 100
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm

ARG STACK=estimator
ARG DEVICE=cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2

WORKDIR /opt/estimator-keras
COPY setup.py README.md ./
COPY estimator_keras ./estimator_keras
COPY experiments ./experiments

# The same extras as the README's install lines, plus kubeflow: in a Kubeflow
# TrainJob the chief reports its progress with Kubeflow's SDK; and MLflow's
# client, for jobs submitted with --track. tf-keras declares the full
# tensorflow wheel as a dependency: beside tensorflow-cpu it goes in without it.
# The extras give Keras 3 (TensorFlow 2.21) only on Python 3.12+: keras3 on an
# older Python would silently get TensorFlow 2.15 instead, hence the check.
# DL3013: the package is this checkout; its extras pin TensorFlow.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3013
RUN if [ "${STACK}" = keras3 ] \
       && ! python -c "import sys; sys.exit(sys.version_info < (3, 12))"; then \
      echo "STACK=keras3 needs Python 3.12 or newer (Keras 3 comes with TensorFlow" \
           "2.21): add --build-arg PYTHON_VERSION=3.12 (or 3.13)" >&2; exit 2; \
    fi \
 && case "${STACK}-${DEVICE}" in \
      estimator-cpu) pip install --no-cache-dir ".[cpu,kubeflow,mlflow-client]" ;; \
      estimator-gpu) pip install --no-cache-dir ".[gpu,kubeflow,mlflow-client]" ;; \
      keras-cpu) pip install --no-cache-dir ".[keras-cpu,kubeflow,mlflow-client]" "tensorflow-cpu==2.21.*" \
                 && pip install --no-cache-dir --no-deps "tf-keras==2.21.*" ;; \
      keras-gpu) pip install --no-cache-dir ".[keras,kubeflow,mlflow-client]" "tensorflow[and-cuda]==2.21.*" \
                 "tf-keras==2.21.*" ;; \
      keras3-cpu) pip install --no-cache-dir ".[cpu,jax,kubeflow,mlflow-client]" ;; \
      keras3-gpu) pip install --no-cache-dir ".[cpu,kubeflow,mlflow-client]" "jax[cuda12]>=0.4.34" ;; \
      *) echo "unknown STACK=${STACK} DEVICE=${DEVICE}: STACK is estimator, keras or" \
              "keras3, DEVICE is cpu or gpu" >&2; exit 2 ;; \
    esac \
 && python -m experiments list

# Training runs as an unprivileged user; relative paths (data/, runs/) land in its home.
RUN useradd --create-home --uid 1000 trainer
USER 1000:1000
WORKDIR /home/trainer

ENTRYPOINT ["python", "-m", "experiments"]
CMD ["--help"]
