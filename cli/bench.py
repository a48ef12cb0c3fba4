"""`corps bench ...`: the benchmark commands, wired; each is defined (its options, over
its module in `corps.bench`) in `bench_engine`, `bench_gpu`, `bench_workflows` or
`bench_serving`."""

from __future__ import annotations

import typer

from corps.cli import bench_engine, bench_gpu, bench_serving, bench_tenants, bench_workflows

bench_app = typer.Typer(
    help="Benchmarks that print measured ratios side by side.", no_args_is_help=True
)
bench_app.command("adapter")(bench_engine.bench_adapter)
bench_app.command("runner")(bench_engine.bench_runner)
bench_app.command("batching")(bench_engine.bench_batching)
bench_app.command("step")(bench_engine.bench_step)
bench_app.command("ops")(bench_engine.bench_ops)
bench_app.command("memory")(bench_engine.bench_memory)
bench_app.command("store")(bench_engine.bench_store)
bench_app.command("evict")(bench_engine.bench_evict)
bench_app.command("kernels")(bench_engine.bench_kernels)
bench_app.command("account")(bench_gpu.bench_account)
bench_app.command("gpu")(bench_gpu.bench_gpu)
bench_app.command("vs-llamacpp")(bench_gpu.bench_vs_llamacpp)
bench_app.command("audit")(bench_workflows.bench_audit)
bench_app.command("workflow")(bench_workflows.bench_workflow)
bench_app.command("constrained")(bench_workflows.bench_constrained)
bench_app.command("mapreduce")(bench_workflows.bench_mapreduce)
bench_app.command("cluster")(bench_workflows.bench_cluster)
bench_app.command("workflows")(bench_workflows.bench_workflows)
bench_app.command("patterns")(bench_workflows.bench_patterns)
bench_app.command("serve")(bench_serving.bench_serve)
bench_app.command("trace")(bench_serving.bench_trace)
bench_app.command("soak")(bench_serving.bench_soak)
bench_app.command("http")(bench_serving.bench_http)
bench_app.command("tenants")(bench_tenants.bench_tenants)
