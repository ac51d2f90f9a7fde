"""The fourth engine's Engine: the engine of the Keras it trains, renamed."""

from fourth_engine import KERAS, NAME

if KERAS == 3:
    from estimator_keras.engines.keras3.engine import Keras3Engine as _Base
else:
    from estimator_keras.engines.keras.engine import KerasEngine as _Base


class FourthEngine(_Base):
    name = NAME
