"""Graph options, given to ``comp_graph`` or set with ``config.set_comp_graph_option``."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb

# name -> (default, a new value to set, the value read back)
OPTIONS = {
    "seq_opt.enable_mem_plan_opt": (True, 0, False),
    "seq_opt.enable_mem_reuse_alloc": (True, 0, False),
    "seq_opt.enable_seq_comp_node_opt": (True, 0, False),
    "force_dynamic_alloc": (False, 1, True),
    "enable_grad_var_static_reshape": (False, 1, True),
    "async_exec_level": (1, 0b110, 6),
    "graph_opt.jit": (0, 2, 2),
    "graph_opt.tensorrt": (False, True, True),
    "graph_opt.weight_preprocess": (False, 1, True),
    "graph_opt_level": (2, -1, -1),
    "allreduce_pack_max_size": (0, 16, 16),
    "allreduce_pack_ignore_first": (2, 5, 5),
    "var_sanity_check_first_run": (True, 0, False),
    "no_profiling_on_shape_change": (False, 1, True),
    "allocate_static_mem_after_graph_compile": (False, 1, True),
    "log_level": (1, 0, 0),
    "enable_sublinear_memory_opt": (False, 1, True),
    "sublinear_mem_cofig.lb_memory": (0, 1024, 1024),
    "sublinear_mem_cofig.genetic_nr_iter": (0, 7, 7),
    "sublinear_mem_cofig.genetic_pool_size": (20, 3, 3),
    "sublinear_mem_cofig.thresh_nr_try": (10, 4, 4),
    "enable_var_mem_defragment": (True, 0, False),
    "eager_evaluation": (False, 1, True),
    "enable_memory_swap": (False, 1, True),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_settable_returns_old(name):
    default, new, readback = OPTIONS[name]
    g = mgb.comp_graph(check_env_var=False)
    old = g.set_option(name, new)
    assert old == default and type(old) is type(default)
    assert g.set_option(name, default) == readback
    assert mgb.config.set_comp_graph_option(g, name, new) == default


def test_sublinear_num_worker_default():
    g = mgb.comp_graph(check_env_var=False)
    old = g.set_option("sublinear_mem_cofig.num_worker", 3)
    assert isinstance(old, int) and old >= 1
    assert g.set_option("sublinear_mem_cofig.num_worker", old) == 3


def test_settable_names_match_the_table():
    from megbrain.graph.options import GraphOptions

    names = set(GraphOptions.settable_names())
    assert names == set(OPTIONS) | {"sublinear_mem_cofig.num_worker"}


@pytest.mark.parametrize(
    "name",
    [
        "no_such_option",
        "graph_opt.android_nn",
        "seq_opt",
        "extra_vardeps",
        "user_data",
        "comp_node_seq_record_level",
    ],
)
def test_unknown_name_raises(name):
    g = mgb.comp_graph(check_env_var=False)
    with pytest.raises(mgb.MegBrainError, match="invalid computing graph option name: "):
        g.set_option(name, 1)
    with pytest.raises(mgb.MegBrainError, match=name.replace(".", r"\.")):
        mgb.config.set_comp_graph_option(g, name, 1)


def test_values_converted_like_c_fields():
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("force_dynamic_alloc", "1")  # int(val)
    assert g.set_option("force_dynamic_alloc", 0.0) is True
    g.set_option("graph_opt.jit", 255)
    assert g.set_option("graph_opt.jit", 0) == 255
    g.set_option("graph_opt_level", "3")
    assert g.set_option("graph_opt_level", 2) == 3
    with pytest.raises((ValueError, TypeError, mgb.MegBrainError)):
        g.set_option("log_level", "high")


def test_aliases():
    g = mgb.comp_graph(check_env_var=False)
    assert g.set_option("log_static_mem_alloc", 0) == 1
    assert g.set_option("log_level", 2) == 0
    assert g.set_option("enable_async_exec", 0) == 1
    assert g.set_option("async_exec_level", 1) == 0
    assert mgb.config.set_comp_graph_option(g, "enable_async_exec", 4) == 1


def test_extra_opts():
    g = mgb.comp_graph(extra_opts={"log_level": 0, "graph_opt_level": 1}, check_env_var=False)
    assert g.set_option("log_level", 1) == 0
    assert g.set_option("graph_opt_level", 2) == 1


def test_env_options(monkeypatch):
    monkeypatch.setenv("MGB_COMP_GRAPH_OPT", "log_level=0;graph_opt_level=1;force_dynamic_alloc=1")
    with pytest.warns(UserWarning, match="MGB_COMP_GRAPH_OPT"):
        g = mgb.comp_graph()
    assert g.set_option("log_level", 1) == 0
    assert g.set_option("graph_opt_level", 2) == 1
    assert g.set_option("force_dynamic_alloc", 0) is True
    # extra_opts win over the env
    with pytest.warns(UserWarning):
        g = mgb.comp_graph(extra_opts={"log_level": 2})
    assert g.set_option("log_level", 1) == 2
    # check_env_var=False ignores the env
    g = mgb.comp_graph(check_env_var=False)
    assert g.set_option("log_level", 1) == 1


def test_env_bad_option_name(monkeypatch):
    monkeypatch.setenv("MGB_COMP_GRAPH_OPT", "not_an_option=1")
    with pytest.raises(mgb.MegBrainError, match="not_an_option"), pytest.warns(UserWarning):
        mgb.comp_graph()


def test_env_user_data(monkeypatch):
    monkeypatch.setenv("MGB_COMP_GRAPH_USER_DATA", "a=1+2;b=[1, 'x'];c={'k': (2, 3)}")
    g = mgb.comp_graph()
    assert g.user_data["a"] == 3
    assert g.user_data["b"] == [1, "x"]
    assert g.user_data["c"] == {"k": (2, 3)}
    assert "a" not in mgb.comp_graph(check_env_var=False).user_data


def test_user_data_is_per_graph_dict():
    g1, g2 = mgb.comp_graph(check_env_var=False), mgb.comp_graph(check_env_var=False)
    g1.user_data["k"] = 1
    assert "k" not in g2.user_data
    assert g1.user_data is g1.user_data


def test_options_take_effect():
    """A few options change what runs, never the results."""
    for name, val in [
        ("force_dynamic_alloc", 1),
        ("seq_opt.enable_mem_plan_opt", 0),
        ("seq_opt.enable_mem_reuse_alloc", 0),
        ("async_exec_level", 0b100),
        ("graph_opt_level", 0),
    ]:
        g = mgb.comp_graph(check_env_var=False)
        g.set_option(name, val)
        x = mgb.make_arg("cpu0", g, name="x", shape=(4,))
        y = ((x + 1) * 2).reshape(2, 2).sum(axis=1)
        f = g.compile([x], mgb.copy_output(y))
        for n in range(2):
            np.testing.assert_allclose(
                f(np.arange(4) + n).reshape(-1), ((np.arange(4) + n + 1) * 2).reshape(2, 2).sum(1)
            )


def test_compgraph_misc():
    g = mgb.comp_graph(check_env_var=False)
    assert not g.is_eager() and not mgb.config.comp_graph_is_eager(g)
    g.set_option("eager_evaluation", 1)
    assert g.is_eager() and mgb.config.comp_graph_is_eager(g)
    assert repr(g).startswith(f"<CompGraph #{g.id} at ")
    assert g == g and g != mgb.comp_graph(check_env_var=False)
    assert hash(g) == hash(g)
