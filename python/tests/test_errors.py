"""pushpull.Error and its subclasses: hierarchy, built-in bases, C++ messages."""

import numpy as np
import pytest

import pushpull
from pushpull import _pushpull


def test_classes_are_importable_from_the_package():
    names = ['Error', 'InvalidArgument', 'NotFound', 'AlreadyExists', 'Timeout', 'PeerFailure',
             'ProtocolError', 'IoError', 'Internal']
    for name in names:
        cls = getattr(pushpull, name)
        assert cls is getattr(_pushpull, name)
        assert cls.__module__ == 'pushpull'
        assert issubclass(cls, pushpull.Error)
    assert issubclass(pushpull.Error, RuntimeError)


@pytest.mark.parametrize('cls, builtin', [
    ('InvalidArgument', ValueError),
    ('NotFound', LookupError),
    ('Timeout', TimeoutError),
    ('IoError', OSError),
])
def test_subclasses_also_derive_from_the_matching_builtin(cls, builtin):
    assert issubclass(getattr(pushpull, cls), builtin)


def test_unknown_key_is_not_found_with_the_cpp_message(kv):
    with pytest.raises(pushpull.NotFound) as e:
        kv.pull(7, out=np.zeros(3, np.float32))
    assert str(e.value) == 'pull: key 7 was never initialised; call init(key, value) first'


def test_second_init_is_already_exists(kv):
    kv.init('w', np.zeros(3, np.float32))
    with pytest.raises(pushpull.AlreadyExists, match="'w'"):
        kv.init('w', np.zeros(3, np.float32))


def test_unknown_store_type_lists_the_valid_ones():
    with pytest.raises(pushpull.InvalidArgument) as e:
        pushpull.kv.create('no_such_type')
    assert 'dist_sync' in str(e.value) and 'local' in str(e.value)


def test_missing_optimizer_state_file_is_io_error(kv, tmp_path):
    kv.set_optimizer('sgd', learning_rate=0.1)
    missing = tmp_path / 'missing.states'
    with pytest.raises(pushpull.IoError, match='missing.states'):
        kv.load_optimizer_states(missing)


def test_optimizer_errors_are_invalid_argument():
    with pytest.raises(pushpull.InvalidArgument, match='momentum'):
        pushpull.optimizer.create('adam', momentum=0.9)  # lists the valid names
    with pytest.raises(pushpull.InvalidArgument, match='sgd'):
        pushpull.optimizer.create('nonexistent')
    with pytest.raises(pushpull.InvalidArgument, match='lr_scheduler'):
        pushpull.optimizer.create('sgd', lr_scheduler=object())


def test_errors_can_be_caught_as_the_base_class(kv):
    with pytest.raises(pushpull.Error):
        kv.push(1, np.zeros(2, np.float32))
