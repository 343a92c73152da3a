"""Models and data for the conformance matrix against Keras `fit` (`tests/test_keras_conformance.py`),
after Keras' guides and keras-io examples: padded sequences (masks, per-token weights), a small
Transformer with an embedding (sparse gradients) under clipping, a guide's own `train_step`."""

from __future__ import annotations

import numpy as np

VOCAB, TAGS, TOKENS = 20, 4, 12


def masked_tagger(batch_size: int, vocab: int = VOCAB, tags: int = TAGS, tokens: int = TOKENS):
    """The guide "Understanding masking & padding": Embedding(mask_zero=True) -> LSTM -> a tag per token."""
    import keras

    inputs = keras.Input(batch_shape=(batch_size, tokens), dtype="int32")
    x = keras.layers.Embedding(vocab, 8, mask_zero=True)(inputs)
    x = keras.layers.LSTM(8, return_sequences=True)(x)
    outputs = keras.layers.Dense(tags, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def padded_tags(rows: int = 64, val_rows: int = 16, vocab: int = VOCAB, tags: int = TAGS, tokens: int = TOKENS):
    """Rows of 2 to 12 tokens padded with 0 (tag 0 on the padding: a model that trains on it learns tag 0)."""
    rng = np.random.default_rng(3)
    total = rows + val_rows
    x = np.zeros((total, tokens), "int32")
    y = np.zeros((total, tokens), "int32")
    for i, length in enumerate(rng.integers(2, tokens + 1, total)):
        x[i, :length] = rng.integers(1, vocab, length)
        y[i, :length] = x[i, :length] % (tags - 1) + 1
    return {"x_train": x[:rows], "y_train": y[:rows], "x_val": x[rows:], "y_val": y[rows:]}


def masked_series(batch_size: int, steps: int = 10, features: int = 3):
    """A `Masking` layer over zero-padded series, a value per time step (mean squared error, MAE)."""
    import keras

    inputs = keras.Input(batch_shape=(batch_size, steps, features))
    x = keras.layers.Masking(mask_value=0.0)(inputs)
    x = keras.layers.GRU(6, return_sequences=True)(x)
    outputs = keras.layers.Dense(1)(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def padded_series(
    rows: int = 64,
    val_rows: int = 16,
    steps: int = 10,
    features: int = 3,
    per_token_weights=False,
    per_row_weights=False,
):
    """Series of 3 to 10 steps padded with zeros; with `per_token_weights` a weight per step (rows, steps), with
    `per_row_weights` one per row (which a loss per step cannot apply: `fit` fails on it too)."""
    rng = np.random.default_rng(5)
    total = rows + val_rows
    x = np.zeros((total, steps, features), "float32")
    for i, length in enumerate(rng.integers(3, steps + 1, total)):
        x[i, :length] = rng.normal(size=(length, features)) + 0.5
    y = np.cumsum(x.sum(axis=2, keepdims=True), axis=1).astype("float32") * 0.1
    data = {"x_train": x[:rows], "y_train": y[:rows], "x_val": x[rows:], "y_val": y[rows:]}
    if per_token_weights:
        weights = rng.uniform(0.2, 3.0, size=(total, steps)).astype("float32")
        data.update(sample_weight_train=weights[:rows], sample_weight_val=weights[rows:])
    if per_row_weights:
        data.update(sample_weight_train=rng.uniform(0.2, 3.0, size=rows).astype("float32"))
    return data


def clipped_transformer(batch_size: int, tokens: int = 16, vocab: int = 50, clip: str = "global_clipnorm"):
    """keras-io "Text classification with Transformer", small: embedding (sparse gradients), attention,
    LayerNorm, compiled with SGD(momentum=0.9) and a clipping setting of 0.5."""
    import keras

    inputs = keras.Input(batch_shape=(batch_size, tokens), dtype="int32")
    x = keras.layers.Embedding(vocab, 16)(inputs)
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + attention)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9, **{clip: 0.5})
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def token_classes(rows: int = 64, val_rows: int = 16, tokens: int = 16, vocab: int = 50, weighted: bool = False):
    """Two classes: whether token ids below 10 are more than a quarter of the row (a weight per row if `weighted`)."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, vocab, size=(rows + val_rows, tokens)).astype("int32")
    y = ((x < 10).mean(axis=1) > 0.25).astype("int32")
    data = {"x_train": x[:rows], "y_train": y[:rows], "x_val": x[rows:], "y_val": y[rows:]}
    if weighted:
        data["sample_weight_train"] = rng.uniform(0.5, 2.0, size=rows).astype("float32")
    return data


def raw_loss_step(batch_size: int, features: int = 4):
    """After the first example of the guide "Customizing what happens in fit()": its `train_step` returns
    the raw loss tensor (and a raw mean error), with `compile` given only a loss (SGD here, for weights)."""
    import keras
    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
            return {"loss": loss, "mean_error": keras.ops.mean(keras.ops.abs(y - y_pred))}

    inputs = keras.Input(batch_shape=(batch_size, features))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    model = CustomModel(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def masked_tagger_own_step(batch_size: int):
    """The guide's `train_step` (customizing fit) on the masked tagger: `self.compute_loss` applies the padding
    mask, and the step returns its raw loss tensor as the logs."""
    import keras
    import tensorflow as tf

    class TaggerWithItsOwnStep(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
            return {"loss": loss}

    tagger = masked_tagger(batch_size)
    model = TaggerWithItsOwnStep(tagger.inputs, tagger.outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    return model


def regression_rows():
    """`tests.models.linear_rows`: 96 training and 32 validation rows of 4 features."""
    from tests.models import linear_rows

    return linear_rows()


WORDS = ["good", "bad", "film", "plot", "actor", "long", "fun", "dull", "scene", "music"]
GENRES = ["drama", "comedy", "horror", "documentary"]


def reviews(rows: int = 64, val_rows: int = 16, words: int = 6):
    """Raw text and a genre (str, one each per row) and whether "good" or "fun" outnumber "bad" or "dull"
    (a comedy counts one more "fun")."""
    rng = np.random.default_rng(11)
    texts = [" ".join(rng.choice(WORDS, words)) for _ in range(rows + val_rows)]
    genres = rng.choice(GENRES, rows + val_rows)
    score = [
        sum(t.split().count(w) for w in ("good", "fun"))
        - sum(t.split().count(w) for w in ("bad", "dull"))
        + (g == "comedy")
        for t, g in zip(texts, genres, strict=True)
    ]
    x = (np.array(texts).reshape(-1, 1), genres.reshape(-1, 1))
    y = (np.array(score) > 0).astype("float32").reshape(-1, 1)
    split = {"train": slice(0, rows), "val": slice(rows, None)}
    return {f"{k}_{name}": (tuple(a[s] for a in x) if k == "x" else y[s]) for name, s in split.items() for k in "xy"}


def text_classifier(batch_size: int, tokens: int = 6):
    """keras-io "Text classification from scratch" end to end, with a structured-data example's string
    feature: `TextVectorization` and `StringLookup` inside the model take the raw strings (adapted in the
    builder on the training rows, so every worker's is the same)."""
    import keras

    data = reviews()
    vectorize = keras.layers.TextVectorization(max_tokens=len(WORDS) + 2, output_sequence_length=tokens)
    vectorize.adapt(data["x_train"][0][:, 0])
    lookup = keras.layers.StringLookup(vocabulary=GENRES, output_mode="one_hot")
    text = keras.Input(batch_shape=(batch_size, 1), dtype="string")
    genre = keras.Input(batch_shape=(batch_size, 1), dtype="string")
    words = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(len(WORDS) + 2, 8)(vectorize(text)))
    kinds = keras.layers.Reshape((len(GENRES) + 1,))(lookup(genre))
    hidden = keras.layers.Concatenate()([words, kinds])
    model = keras.Model([text, genre], keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy", metrics=["accuracy"])
    return model


def review_batches(global_batch_size: int):
    """The reviews as keras-io feeds them: `tf.data` batches of ((text, genre), label) (`fit` takes no
    NumPy strings)."""
    import tensorflow as tf

    data = reviews()
    batched = {
        split: tf.data.Dataset.from_tensor_slices((data[f"x_{split}"], data[f"y_{split}"])).batch(global_batch_size)
        for split in ("train", "val")
    }
    return {"x_train": batched["train"], "x_val": batched["val"]}


def summed_squares():
    """A `keras.losses.Loss` subclass with `reduction="sum"`: the batch's sum, not its mean."""
    import keras

    class SummedSquares(keras.losses.Loss):
        def __init__(self):
            super().__init__(name="summed_squares", reduction="sum")

        def call(self, y_true, y_pred):
            return keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)

    return SummedSquares()


def compiled_two_outputs(batch_size: int, features: int = 4):
    """A level (regression) and a kind (3 classes) compiled with what `compile` takes beyond one loss: a loss
    per output (one a `Loss` subclass summing over the batch), loss weights, metrics and weighted metrics, a
    layer's L2 regularizer, and SGD with momentum, weight decay, clipnorm, EMA and a schedule."""
    import keras

    inputs = keras.Input(batch_shape=(batch_size, features))
    hidden = keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(1e-3))(inputs)
    level = keras.layers.Dense(1, name="level")(hidden)
    kind = keras.layers.Dense(3, activation="softmax", name="kind")(hidden)
    model = keras.Model(inputs, {"level": level, "kind": kind})
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=4, decay_rate=0.9)
    optimizer = keras.optimizers.SGD(
        schedule, momentum=0.9, weight_decay=1e-3, clipnorm=1.0, use_ema=True, ema_momentum=0.9
    )
    model.compile(
        optimizer=optimizer,
        loss={"level": summed_squares(), "kind": "sparse_categorical_crossentropy"},
        loss_weights={"level": 0.5, "kind": 2.0},
        metrics={"level": ["mae"], "kind": ["accuracy"]},
        weighted_metrics={"level": ["mse"], "kind": []},
    )
    return model


def weighted_levels_and_kinds():
    """`tests.models.levels_and_kinds` with a sample weight per row (applied to both outputs, as in `fit`), the
    levels around 1 (a bias that ends near zero compares round-off against nothing)."""
    from tests.models import levels_and_kinds

    data = levels_and_kinds()
    for split in ("train", "val"):
        data[f"y_{split}"]["level"] = data[f"y_{split}"]["level"] + 1.0
    rng = np.random.default_rng(13)
    data["sample_weight_train"] = rng.uniform(0.2, 3.0, size=len(data["x_train"])).astype("float32")
    return data


def position_transformer(batch_size: int, tokens: int = 16, vocab: int = 50, clip: str | None = "global_clipnorm"):
    """keras-io "Text classification with Transformer" as written there (embed 16, 2 heads, feed-forward 16,
    Dropout at rate 0 for the comparison): `TokenAndPositionEmbedding` looks the positions up once and
    broadcasts them over the batch (a sparse gradient whose rows are not the batch's), inputs of a free batch
    (`shape=(maxlen,)`), compiled with SGD(momentum=0.9) and a clipping setting of 0.5 (`clip=None`: none)."""
    import keras
    from keras import layers, ops

    class TransformerBlock(layers.Layer):
        def __init__(self, embed_dim, num_heads, ff_dim, rate=0.0):
            super().__init__()
            self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
            self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
            self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
            self.dropout1 = layers.Dropout(rate)
            self.dropout2 = layers.Dropout(rate)

        def call(self, inputs):
            attn_output = self.dropout1(self.att(inputs, inputs))
            out1 = self.layernorm1(inputs + attn_output)
            return self.layernorm2(out1 + self.dropout2(self.ffn(out1)))

    class TokenAndPositionEmbedding(layers.Layer):
        def __init__(self, maxlen, vocab_size, embed_dim):
            super().__init__()
            self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
            self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

        def call(self, x):
            positions = self.pos_emb(ops.arange(start=0, stop=ops.shape(x)[-1], step=1))
            return self.token_emb(x) + positions

    inputs = layers.Input(shape=(tokens,))
    x = TokenAndPositionEmbedding(tokens, vocab, 16)(inputs)
    x = TransformerBlock(16, 2, 16)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(20, activation="relu")(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9, **({clip: 0.5} if clip else {}))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def weighted_own_steps(batch_size: int, features: int = 4):
    """The guide "Customizing what happens in fit()" with sample weights: its own `train_step` and `test_step`
    unpack `(x, y, sample_weight)` and give the weights to `compute_loss` and `compute_metrics` (a weighted
    MAE), returning the step's loss beside the metrics."""
    import keras
    import tensorflow as tf

    class WeightedSteps(keras.Model):
        def train_step(self, data):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
            return {**self.compute_metrics(x, y, y_pred, sample_weight=sample_weight), "loss": loss}

        def test_step(self, data):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            y_pred = self(x, training=False)
            loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
            return {**self.compute_metrics(x, y, y_pred, sample_weight=sample_weight), "loss": loss}

    inputs = keras.Input(batch_shape=(batch_size, features))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    model = WeightedSteps(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", weighted_metrics=["mae"])
    return model


def weighted_rows():
    """`tests.models.linear_rows` with a sample weight per training and per validation row."""
    from tests.models import linear_rows

    return linear_rows(weighted=True)
