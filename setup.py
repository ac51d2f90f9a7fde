"""estimator-keras: fast, boring Keras training on TFRecord data with tf.estimator."""

import os
import re

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(HERE, "estimator_keras", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _readme():
    path = os.path.join(HERE, "README.md")
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read()


setup(
    name="estimator-keras",
    version=_version(),
    description="Keras models trained from TFRecords with tf.estimator: fast input "
                "pipelines, train_and_evaluate, clusters, Keras-loadable exports.",
    long_description=_readme(),
    long_description_content_type="text/markdown",
    packages=["estimator_keras", "experiments", "benchmarks"],
    python_requires=">=3.9,<3.12",
    # TensorFlow itself comes from an extra, so a CPU user never pulls the
    # GPU wheels and a GPU user can: pip install "estimator-keras[cpu]" or [gpu].
    install_requires=[
        "tensorflow-estimator==2.15.*",
        "numpy<2",
    ],
    extras_require={
        "cpu": ["tensorflow-cpu==2.15.*"],
        "gpu": ["tensorflow[and-cuda]==2.15.*"],
        "cloud": ["google-cloud-aiplatform", "google-cloud-storage"],
        "test": ["pytest", "mock", "pyyaml"],
    },
    entry_points={"console_scripts": ["estimator-keras=experiments.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.9",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
