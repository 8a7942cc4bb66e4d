"""Optimizers for ``KVStore.set_optimizer``, as in ``mxnet.optimizer``.

    opt = pushpull.optimizer.create('sgd', learning_rate=0.1, momentum=0.9)
    kv.set_optimizer(opt)

An optimizer here is a description (a name and numeric hyperparameters): the
update itself runs in C++ inside the store, on the parameter servers for
``dist_*`` stores. Names: sgd, nag, adam, adagrad, rmsprop, test. The
hyperparameters and their defaults are MXNet's (docs/kvstore.md); an unknown
name or hyperparameter raises ``pushpull.InvalidArgument`` listing the valid
ones, at creation.
"""

from . import _pushpull
from ._pushpull import InvalidArgument

__all__ = ['Optimizer', 'create', 'names', 'SGD', 'NAG', 'Adam', 'AdaGrad', 'RMSProp', 'Test']


def _number(name, key, value):
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"optimizer '{name}': hyperparameter {key}={value!r} is not a number; pushpull "
            f"optimizers take numeric hyperparameters only (no lr_scheduler, param_idx2name, ...)"
        ) from None


class Optimizer:
    """An optimizer spec: ``name`` and ``hyperparameters`` (every one, with the
    defaults filled in). ``str(opt)`` is the text form, "sgd:learning_rate=0.1,..."."""

    def __init__(self, name, **hyperparameters):
        if not isinstance(name, str):
            raise InvalidArgument(f'optimizer name must be a str, got {name!r}')
        hp = {k: _number(name, k, v) for k, v in hyperparameters.items()}
        self.name, self.hyperparameters = _pushpull.optimizer_spec(name.lower(), hp)

    @classmethod
    def from_string(cls, text):
        """From the text form "name" or "name:k=v,k=v"."""
        name, hp = _pushpull.parse_optimizer_spec(text)
        return cls(name, **hp)

    def __getattr__(self, key):
        # opt.learning_rate, opt.momentum, ... as in MXNet.
        hp = self.__dict__.get('hyperparameters', {})
        if key in hp:
            return hp[key]
        raise AttributeError(key)

    def __str__(self):
        return self.name + ':' + ','.join(f'{k}={v!r}' for k, v in
                                          sorted(self.hyperparameters.items()))

    def __repr__(self):
        return f'pushpull.optimizer.create({self.name!r}, ' + ', '.join(
            f'{k}={v!r}' for k, v in sorted(self.hyperparameters.items())) + ')'

    def __eq__(self, other):
        return (isinstance(other, Optimizer) and self.name == other.name and
                self.hyperparameters == other.hyperparameters)


def create(name, **kwargs):
    """``create('sgd', learning_rate=0.1, ...)``; ``name`` may also be an
    Optimizer (returned as is) or the text form "sgd:learning_rate=0.1"."""
    if isinstance(name, Optimizer):
        if kwargs:
            raise InvalidArgument('create(optimizer, **kwargs): give either an Optimizer or a '
                                  'name with keywords')
        return name
    if isinstance(name, str) and ':' in name:
        base = Optimizer.from_string(name)
        return Optimizer(base.name, **{**base.hyperparameters, **kwargs})
    return Optimizer(name, **kwargs)


def names():
    """The optimizer names ``create`` accepts."""
    return _pushpull.optimizer_names()


def _named(opt_name, doc):

    class Named(Optimizer):
        __doc__ = doc

        def __init__(self, **hyperparameters):
            super().__init__(opt_name, **hyperparameters)

    return Named


SGD = _named('sgd', 'SGD with momentum: learning_rate=0.01, momentum=0, wd, rescale_grad, ...')
NAG = _named('nag', "Nesterov's accelerated gradient: learning_rate=0.01, momentum=0, ...")
Adam = _named('adam', 'Adam: learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, ...')
AdaGrad = _named('adagrad', 'AdaGrad: learning_rate=0.01, epsilon=1e-7, ...')
RMSProp = _named('rmsprop', 'RMSProp: learning_rate=0.001, gamma1=0.9, gamma2=0.9, centered, ...')
Test = _named('test', "MXNet's test optimizer: weight += rescale_grad * grad.")
for _cls, _n in ((SGD, 'SGD'), (NAG, 'NAG'), (Adam, 'Adam'), (AdaGrad, 'AdaGrad'),
                 (RMSProp, 'RMSProp'), (Test, 'Test')):
    _cls.__name__ = _cls.__qualname__ = _n
del _cls, _n
