"""DistributedOptimizer: Horovod's gradient-averaging optimizer wrapper.

Each parameter's gradient is allreduced as soon as autograd has accumulated it
(a hook on the parameter's AccumulateGrad node, Horovod's trick for torch 1.x,
which has no tensor-level post-accumulate hook), so communication overlaps the
rest of the backward pass; ``step()`` waits for the outstanding allreduces and
then runs the wrapped optimizer's update.

Threading: autograd runs the hooks on the thread that called backward(); the
allreduces themselves run on the engine's thread.
"""

import contextlib
import warnings

import torch

from pushpull._pushpull import InvalidArgument
from . import ops
from .compression import Compression, GatheredCompressor
from .process_sets import ProcessSet
from .sparse import sparse_allreduce_async


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, sparse_as_dense, process_set, groups):
        super(self.__class__, self).__init__(params)
        if isinstance(compression, type) and issubclass(compression, GatheredCompressor):
            compression = compression()  # the residuals belong to this optimizer
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        # As Horovod: on a rank outside ``process_set`` the optimizer is a plain
        # local one (no hooks, no communication); a set must be registered.
        self._member = not isinstance(process_set, ProcessSet) or process_set.included()
        if self._member:
            ops._scope(process_set, 'DistributedOptimizer')
        self.backward_passes_per_step = backward_passes_per_step
        if op is ops.Adasum:
            raise InvalidArgument(
                'DistributedOptimizer: op=Adasum is not supported (Horovod implements it for MPI '
                'and NCCL builds only); use op=Average (or Sum)')
        if gradient_predivide_factor != 1.0 and op != ops.Average:
            raise InvalidArgument(
                'DistributedOptimizer: gradient_predivide_factor needs op=Average')
        self.op = op
        self._prescale = 1.0
        self._postscale = 1.0
        if gradient_predivide_factor != 1.0:
            # Horovod's split of the average: sum g/f, then multiply by f/size.
            self.op = ops.Sum
            self._prescale = 1.0 / gradient_predivide_factor
            self._postscale = gradient_predivide_factor / self._set_size()

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
            self._parameter_names = {p: 'grad.%s' % name for name, p in named_parameters}
            unnamed = [i for i, p in enumerate(all_params) if p not in self._parameter_names]
            if unnamed:
                raise InvalidArgument(
                    'DistributedOptimizer: named_parameters was given, but the optimizer\'s '
                    'parameters at positions %s are not in it; pass model.named_parameters() of '
                    'the model whose parameters the optimizer updates' % unnamed)
        else:
            self._parameter_names = {p: 'grad.noname.%d' % i for i, p in enumerate(all_params)}

        self._group_of = _group_map(groups, all_params)
        self._group_ready = {}
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._allreduce_delay = {}
        self._synchronized = False
        self._should_synchronize = True
        if self._set_size() > 1:
            self._register_hooks()

    def _set_size(self):
        """Ranks averaging with this one: 1 outside the process set."""
        if not self._member:
            return 1
        return ops._c.size() if self._process_set is None else self._process_set.size()

    # ---- hooks ------------------------------------------------------------------

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group['params']:
                if not p.requires_grad:
                    continue
                self._requires_update.add(p)
                self._allreduce_delay[p] = self.backward_passes_per_step
                # expand_as gives a view whose grad_fn leads to p's AccumulateGrad
                # node; keeping the node alive keeps the hook registered.
                grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                grad_acc.register_hook(self._make_hook(p))
                self._grad_accs.append(grad_acc)

    def _make_hook(self, p):
        def hook(*unused):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise InvalidArgument(
                        'DistributedOptimizer: gradients were computed more than '
                        'backward_passes_per_step=%d times before step(); increase '
                        'backward_passes_per_step to accumulate gradients locally'
                        % self.backward_passes_per_step)
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            self._handles[p] = (handle, ctx)
            if self._allreduce_delay[p] == 0:
                group = self._group_of.get(p)
                if group is None:
                    self._handles[p] = self._allreduce_grad_async(p)
                else:  # submitted together once every member's gradient is ready
                    ready = self._group_ready.setdefault(id(group), set())
                    ready.add(p)
                    if len(ready) == sum(1 for q in group if q in self._requires_update):
                        self._submit_group(group)
        return hook

    def _submit_group(self, group):
        """Starts the allreduces of a group's members at once (the engine fuses
        them: Horovod's grouped allreduce), in the group's order."""
        self._group_ready.pop(id(group), None)
        for q in group:
            if q in self._requires_update:
                self._handles[q] = self._allreduce_grad_async(q)

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # Unused this step on this rank: contribute zeros so every rank
            # submits the same names.
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        name = self._parameter_names[p]
        grad = p.grad
        if grad.is_sparse:
            if not self._sparse_as_dense:
                # Horovod's allgather path: indices and values of every rank.
                if self.op not in (ops.Average, ops.Sum):
                    raise InvalidArgument('DistributedOptimizer: sparse gradients need op=Average '
                                          'or Sum (or sparse_as_dense=True)')
                return sparse_allreduce_async(grad, name=name, op=self.op,
                                              process_set=self._process_set), 'sparse'
            # Densified for the allreduce only; synchronize() gives the wrapped
            # optimizer a sparse gradient back (as Horovod: SparseAdam needs one).
            grad = grad.to_dense()
        if getattr(self._compression, 'gathers', False):
            # 1bit/2bit: every rank's codes, summed by each rank in synchronize().
            codes = self._compression.encode(name, grad * self._prescale
                                             if self._prescale != 1.0 else grad)
            return ops.allgather_async(codes, name=name, process_set=self._process_set), \
                ('codes', grad is not p.grad)
        compressed, ctx = self._compression.compress(grad)
        handle = ops.allreduce_async_(compressed, name=name, op=self.op,
                                      prescale_factor=self._prescale,
                                      postscale_factor=self._postscale,
                                      process_set=self._process_set)
        return handle, (ctx, grad is not p.grad)

    # ---- Horovod's public methods -------------------------------------------------

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those whose hooks did
        not fire) and writes the averaged gradients into ``p.grad``."""
        if self._set_size() == 1:
            self._synchronized = True
            return
        # Whatever the hooks did not start, in parameter order (the same on
        # every rank); a group goes whole.
        for p in [q for group in self.param_groups for q in group['params']]:
            if p not in self._requires_update or self._handles.get(p, (None,))[0] is not None:
                continue
            group = self._group_of.get(p)
            if group is None:
                self._handles[p] = self._allreduce_grad_async(p)
            else:
                self._submit_group(group)
        self._group_ready.clear()
        for p, (handle, ctx) in self._handles.items():
            output = ops.synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if ctx == 'sparse':
                p.grad = output.coalesce()
                continue
            ctx, densified = ctx
            if ctx == 'codes':
                grad = self._compression.sum(output, self._set_size(), p.grad)
                if self.op == ops.Average:
                    grad /= self._set_size()
                grad *= self._postscale
            else:
                grad = self._compression.decompress(output, ctx)
            if densified:
                p.grad = grad.to_sparse()
            elif grad is not p.grad:
                p.grad.copy_(grad)
        self._handles.clear()
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
        if self._handles:
            raise InvalidArgument(
                'DistributedOptimizer: zero_grad() was called after backward() but before '
                'step() or synchronize(); the pending allreduces would be lost. Call '
                'zero_grad() before backward() or after step()')
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def _group_map(groups, params):
    """{parameter: its group (a list)} for Horovod's ``groups``: a number of
    groups (the parameters split in order into that many) or a list of lists
    of parameters (the others go alone)."""
    if groups is None or groups == 0:
        return {}
    if isinstance(groups, bool) or not isinstance(groups, (int, list, tuple)):
        raise InvalidArgument('DistributedOptimizer: groups must be a non-negative number or a '
                              'list of lists of parameters; got %r' % (groups,))
    if isinstance(groups, int):
        if groups < 0:
            raise InvalidArgument('DistributedOptimizer: groups (num_groups) must be >= 0, got %d'
                                  % groups)
        params = [p for p in params if p.requires_grad]
        k = min(groups, len(params)) or 1
        size, extra = divmod(len(params), k)
        lists, start = [], 0
        for i in range(k):
            end = start + size + (1 if i < extra else 0)
            lists.append(params[start:end])
            start = end
    else:
        lists = [list(g) for g in groups]
    known = {id(p) for p in params}
    out = {}
    for g in lists:
        for p in g:
            if not isinstance(p, torch.Tensor):
                raise InvalidArgument('DistributedOptimizer: groups must hold parameters '
                                      '(torch.Tensor), got %s' % type(p).__name__)
            if p in out:
                raise InvalidArgument('DistributedOptimizer: a parameter appears in two groups')
            if id(p) not in known:
                raise InvalidArgument('DistributedOptimizer: groups holds a tensor that is not a '
                                      'parameter of the optimizer')
            out[p] = g
    return out


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
    if backward_passes_per_step < 1:
        raise InvalidArgument('DistributedOptimizer: backward_passes_per_step must be >= 1')
    # A subclass of the optimizer's own class (as Horovod does), so isinstance
    # checks, LR schedulers and state_dict keep working.
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, sparse_as_dense, process_set, groups)
