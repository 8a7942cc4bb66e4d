"""DistributedOptimizer: Horovod's gradient-averaging optimizer wrapper.

Each parameter's gradient is reduced as soon as autograd has accumulated it
(a hook on the parameter's AccumulateGrad node, Horovod's trick for torch 1.x,
which has no tensor-level post-accumulate hook), so communication overlaps the
rest of the backward pass; ``step()`` waits for the outstanding reductions and
then runs the wrapped optimizer's update.

The policy (names, backward_passes_per_step, groups, process sets, predivide,
compression none/fp16/2bit/1bit) is the C++ GradientReducer that the libtorch
DistributedOptimizer uses too (include/pushpull/frontend/gradient_reducer.h,
bound as ``_pushpull.collective.GradientReducer``); this file keeps the torch
glue: hooks, tensors, sparse gradients, custom compressors, Horovod's API.

Threading: autograd runs the hooks on the thread that called backward(); the
reductions themselves run on the engine's thread.
"""

import contextlib
import gc
import re
import warnings

import torch

from pushpull._pushpull import InvalidArgument
from pushpull._pushpull import collective as _c
from . import ops
from .compression import Compression, FP16Compressor, GatheredCompressor, NoneCompressor
from .process_sets import ProcessSet
from .sparse import _gather_rows_async


def _codec_of(compression):
    """(the reducer's compression, threshold, a custom compressor or None)."""
    if isinstance(compression, type) and issubclass(compression, GatheredCompressor):
        compression = compression()  # the residuals belong to this optimizer
    if isinstance(compression, GatheredCompressor):
        return compression.type, compression.threshold, None
    kind = compression if isinstance(compression, type) else type(compression)
    if issubclass(kind, NoneCompressor):
        return 'none', 0.5, None
    if issubclass(kind, FP16Compressor):
        return 'fp16', 0.5, None
    return 'none', 0.5, compression  # the user's: compress/decompress around the reduction


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, sparse_as_dense, process_set, groups):
        super(self.__class__, self).__init__(params)
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self._prefix = ''  # the engine names' process-set prefix
        # As Horovod: on a rank outside ``process_set`` the optimizer is a plain
        # local one (no communication); a set must be registered.
        members, prefix = [], ''
        if not isinstance(process_set, ProcessSet) or process_set.included():
            members, prefix, _ = ops._scope(process_set, 'DistributedOptimizer')
            self._prefix = prefix
        elif process_set is not None:
            members = process_set._members()
        self.backward_passes_per_step = backward_passes_per_step
        if op is ops.Adasum:
            raise InvalidArgument(
                'DistributedOptimizer: op=Adasum is not supported (Horovod implements it for MPI '
                'and NCCL builds only); use op=Average (or Sum)')
        self.op = op

        all_params = [p for group in self.param_groups for p in group['params']]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
            if any(not isinstance(item, tuple) or len(item) != 2 for item in named_parameters):
                raise InvalidArgument(
                    'DistributedOptimizer: named_parameters must be a list of (name, parameter) '
                    'tuples, as model.named_parameters() gives')
            names = [name for name, _ in named_parameters]
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise InvalidArgument(
                    'DistributedOptimizer: parameter names are not unique: %s' % duplicates)
            self._parameter_names = {p: name for name, p in named_parameters}
            unnamed = [i for i, p in enumerate(all_params) if p not in self._parameter_names]
            if unnamed:
                raise InvalidArgument(
                    'DistributedOptimizer: named_parameters was given, but the optimizer\'s '
                    'parameters at positions %s are not in it; pass model.named_parameters() of '
                    'the model whose parameters the optimizer updates' % unnamed)
        else:
            self._parameter_names = {p: 'noname.%d' % i for i, p in enumerate(all_params)}

        # The reduced parameters (the reducer's indices): those that need a gradient.
        self._params = []
        for p in all_params:
            if p.requires_grad and not any(p is q for q in self._params):
                self._params.append(p)
        kind, threshold, self._custom = _codec_of(compression)
        index_groups, num_groups = _group_indices(groups, all_params, self._params)
        self._reducer = _c.GradientReducer(
            [self._parameter_names[p] for p in self._params], members, prefix + 'grad.', op,
            backward_passes_per_step, gradient_predivide_factor, kind, threshold, index_groups,
            num_groups)
        self._copies = {}    # index: (tensor reduced, context, kind) when not p.grad itself
        self._external = {}  # index: (a sparse allgather's handle, its sparse_dim)
        # Parameters every rank knows to be sparse (index: sparse_dim): the
        # weights of sparse embedding modules, and those whose gradient an
        # earlier step reduced as sparse. A rank without a gradient for one
        # contributes an empty sparse gradient, so the ranks agree.
        self._declared_sparse = {} if sparse_as_dense else _sparse_module_weights(self._params)
        self._sparse_dims = dict(self._declared_sparse)
        self._guessed = {}   # index: 'none' (dense zeros) or 'sparse', not known sparse
        self._grad_accs = []
        self._synchronized = False
        self._should_synchronize = True
        self._register_hooks()

    # ---- hooks ------------------------------------------------------------------

    def _register_hooks(self):
        for i, p in enumerate(self._params):
            # expand_as gives a view whose grad_fn leads to p's AccumulateGrad
            # node; keeping the node alive keeps the hook registered.
            grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
            grad_acc.register_hook(self._make_hook(i))
            self._grad_accs.append(grad_acc)

    def _make_hook(self, i):
        def hook(*unused):
            self._reducer.before_accumulate(i)
            self._submit(self._reducer.grad_ready(i))
        return hook

    def _submit(self, indices):
        """Starts the reductions the reducer handed out; on an error the rest
        go back to it (synchronize() submits them)."""
        for k, i in enumerate(indices):
            try:
                self._submit_one(i)
            except BaseException:
                for j in indices[k:]:
                    self._copies.pop(j, None)
                    self._reducer.hand_back(j)
                raise

    def _submit_one(self, i):
        p = self._params[i]
        grad = p.grad
        known = None if self._sparse_as_dense else self._sparse_dims.get(i)
        if known is not None and (grad is None or not grad.is_sparse):
            # Sparse on the other ranks (every rank knows it): no gradient is
            # an empty sparse one, a dense one goes as its nonzero rows.
            grad = _empty_sparse(p, known) if grad is None else grad.to_sparse(known)
        elif grad is None:
            # Unused this step on this rank: contribute zeros so every rank
            # submits the same names.
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            grad = p.grad
            if not self._sparse_as_dense:
                self._guessed[i] = 'none'
        if grad.is_sparse:
            if not self._sparse_as_dense:
                # Horovod's allgather path: indices and values of every rank,
                # under the name a dense gradient's allreduce has (sparse.py).
                if self.op not in (ops.Average, ops.Sum):
                    raise InvalidArgument('DistributedOptimizer: sparse gradients need op=Average '
                                          'or Sum (or sparse_as_dense=True)')
                if known is None:
                    self._guessed[i] = 'sparse'
                self._external[i] = (_gather_rows_async(
                    grad, 'grad.' + self._parameter_names[p], self.op, self._process_set,
                    grad.sparse_dim()), grad.sparse_dim())
                return
            # Densified for the reduction only; synchronize() gives the wrapped
            # optimizer a sparse gradient back (as Horovod: SparseAdam needs one).
            self._copies[i] = (grad.to_dense(), None, 'sparse')
        elif self._custom is not None:
            sent, ctx = self._custom.compress(grad)
            self._copies[i] = (sent.contiguous(), ctx, 'custom')
        elif not grad.is_contiguous():
            self._copies[i] = (grad.contiguous(), None, 'copy')
        ops._check(self._copies[i][0] if i in self._copies else grad, 'gradient')
        self._reducer.submit(i, ops._raw(self._copies[i][0] if i in self._copies else grad))

    def _quiesce(self):
        """An elastic reset (elastic.py): the old group failed the reductions in
        flight; start the round afresh (the reducer uses the new session)."""
        self._reducer.abandon()
        self._copies.clear()
        self._external.clear()
        self._guessed.clear()
        # A worker that joins now knows only the modules: so do the survivors.
        self._sparse_dims = dict(self._declared_sparse)
        self._synchronized = False

    def _explain(self, error, guessed):
        """A negotiation's "submitted differently" error about a parameter
        this rank could not know to be sparse, in the user's terms."""
        for i, what in guessed.items():
            name = self._parameter_names[self._params[i]]
            if ("'%sgrad.%s'" % (self._prefix, name) not in str(error) or
                    not _kinds_differ(str(error))):
                continue
            mine = ('got no gradient for it and contributed dense zeros' if what == 'none' else
                    'contributed a sparse gradient')
            return InvalidArgument(
                'DistributedOptimizer: parameter \'%s\' has a sparse gradient on some ranks and '
                'no (or a dense) gradient on others (this rank %s): a rank without a gradient '
                'cannot tell that the parameter is sparse, since it is not the weight of an '
                'nn.Embedding or nn.EmbeddingBag with sparse=True and no earlier step reduced it '
                'as sparse. Pass sparse_as_dense=True to DistributedOptimizer, or give every rank '
                'a gradient for it in every step. (%s)' % (name, mine, error))
        return None

    # ---- Horovod's public methods -------------------------------------------------

    def synchronize(self):
        """Waits for every gradient's reduction (starting those whose hooks did
        not fire) and writes the averaged gradients into ``p.grad``."""
        if not self._reducer.active:
            self._reducer.synchronize()  # a new round of passes
            self._synchronized = True
            return
        # Whatever the hooks did not start, in parameter order (the same on
        # every rank); a group goes whole.
        self._submit(self._reducer.take_unsubmitted())
        copies, self._copies = self._copies, {}
        external, self._external = self._external, {}
        guessed, self._guessed = self._guessed, {}
        try:
            self._reducer.synchronize()
            for i, (h, sparse_dim) in external.items():
                self._params[i].grad = ops.synchronize(h).coalesce()
                self._sparse_dims[i] = sparse_dim  # every rank reduced it as sparse
            for i, (sent, ctx, kind) in copies.items():
                p = self._params[i]
                if kind == 'sparse':
                    p.grad = sent.to_sparse()
                elif kind == 'custom':
                    p.grad.copy_(self._custom.decompress(sent, ctx))
                else:
                    p.grad.copy_(sent)
        except InvalidArgument as e:
            clear = self._explain(e, guessed)
            if clear is None:
                raise
            raise clear from e
        finally:
            for i in external:
                self._reducer.finish_external(i)
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For a step() after an explicit synchronize() (e.g. gradient clipping)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # Horovod's text (scripts and tests match on it).
                warnings.warn('optimizer.step() called without optimizer.skip_synchronize() '
                              'context after optimizer.synchronize(). This can cause training '
                              'slowdown. You may want to consider using '
                              'optimizer.skip_synchronize() context if you use '
                              'optimizer.synchronize() in your code.')
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._reducer.pending:
            raise InvalidArgument(
                'DistributedOptimizer: zero_grad() was called after backward() but before '
                'step() or synchronize(); the pending allreduces would be lost. Call '
                'zero_grad() before backward() or after step()')
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def _kinds_differ(text):
    """Whether a "submitted differently" error shows sparse rows (one uint8
    allgather, sparse.py) on some ranks and another op on others: only then is
    it the sparse/dense mismatch _explain describes (not, say, two shapes of
    an unused dense parameter)."""
    kinds = re.findall(r'rank \d+: (allgather uint8\(\d+, \d+\))?', text)
    return any(kinds) and not all(kinds)


def _sparse_module_weights(params):
    """{index in params: 1} for the weights of the nn.Embedding and
    nn.EmbeddingBag modules with sparse=True (found among the live objects
    once: the optimizer gets parameters, not modules). Every rank builds the
    same model, so every rank finds the same ones."""
    index = {id(p): i for i, p in enumerate(params)}
    found = {}
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, kinds) or not obj.sparse:
                continue
        except Exception:  # a proxy whose __class__ raises is no module of ours
            continue
        i = index.get(id(getattr(obj, 'weight', None)))
        if i is not None:
            found[i] = 1
    return found


def _empty_sparse(p, sparse_dim):
    """A sparse gradient of p with no rows (a rank that did not use p)."""
    return torch.sparse_coo_tensor(torch.zeros((sparse_dim, 0), dtype=torch.int64),
                                   p.new_zeros((0,) + tuple(p.shape[sparse_dim:])), p.shape)


def _group_indices(groups, params, reduced):
    """(lists of the reducer's indices, num_groups) for Horovod's ``groups``: a
    number of groups (the reducer splits the reduced parameters in order) or
    a list of lists of parameters (the others go alone)."""
    if groups is None or groups == 0:
        return [], 0
    if isinstance(groups, bool) or not isinstance(groups, (int, list, tuple)):
        raise InvalidArgument('DistributedOptimizer: groups must be a non-negative number or a '
                              'list of lists of parameters; got %r' % (groups,))
    if isinstance(groups, int):
        if groups < 0:
            raise InvalidArgument('DistributedOptimizer: groups (num_groups) must be >= 0, got %d'
                                  % groups)
        return [], groups
    known = {id(p) for p in params}
    index = {id(p): i for i, p in enumerate(reduced)}
    seen, out = set(), []
    for g in groups:
        indices = []
        for p in g:
            if not isinstance(p, torch.Tensor):
                raise InvalidArgument('DistributedOptimizer: groups must hold parameters '
                                      '(torch.Tensor), got %s' % type(p).__name__)
            if id(p) in seen:
                raise InvalidArgument('DistributedOptimizer: a parameter appears in two groups')
            if id(p) not in known:
                raise InvalidArgument('DistributedOptimizer: groups holds a tensor that is not a '
                                      'parameter of the optimizer')
            seen.add(id(p))
            if id(p) in index:  # one that needs no gradient is not reduced
                indices.append(index[id(p)])
        out.append(indices)
    return out, 0


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=ops.Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=None):
    """Wraps a torch optimizer so that step() applies gradients averaged (op)
    over all ranks, as horovod.torch.DistributedOptimizer.

    ``groups`` (or the older ``num_groups``), as Horovod: a number k splits the
    parameters, in order, into k groups; a list of lists of parameters names
    the groups (the others go alone). A group's allreduces start together once
    every member's gradient is ready, so the engine fuses them (a grouped
    allreduce). Sparse gradients are allgathered (indices and values), or
    densified for the allreduce with ``sparse_as_dense`` (the wrapped optimizer
    still gets a sparse gradient). ``process_set``: the gradients are averaged
    over that set's ranks only."""
    if num_groups:
        warnings.warn('DistributedOptimizer: num_groups is deprecated (as in Horovod); use '
                      'groups', DeprecationWarning)
        if groups is None:
            groups = num_groups
    # A subclass of the optimizer's own class (as Horovod does), so isinstance
    # checks, LR schedulers and state_dict keep working.
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, sparse_as_dense, process_set, groups)
