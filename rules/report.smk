# Reports: figures, the benchmark summary (results/<experiment>/benchmark.md) and HTML
# pages of the data, plan and benchmark reports, all marked for `snakemake --report`.
# Snakemake's HTML report shows HTML and images inline (Markdown only as a download),
# hence the HTML pages. After a run whose DAG holds rule `report`, the `onsuccess`
# handler writes results/<experiment>/report.html (src/draftsmith/reporting/workflow.py).

from draftsmith.reporting.workflow import ReportedFiles, write_html_report

reported = ReportedFiles(PLAN.results_dir, config["experiment"])


rule report:
    input:
        data_report=str(PLAN.merged_dir / "data_report.json"),
        data_report_md=str(PLAN.merged_dir / "data_report.md"),
        plan_report=str(PLAN.results_dir / "plan_report.json"),
        plan_report_md=str(PLAN.results_dir / "plan_report.md"),
        train_summary=str(PLAN.draft_dir / "train_summary.json"),
        metrics=[str(PLAN.metrics(i)) for i in range(PLAN.num_segments)],
        benchmark=(
            [str(PLAN.eval_dir / "benchmark.json")]
            if config["evaluate"]["enabled"]
            else []
        ),
        serve_benchmark=(
            [str(PLAN.serve_bench_dir / "serve_benchmark.md")]
            if config["serve_benchmark"]["enabled"]
            else []
        ),
    output:
        summary=str(PLAN.results_dir / "benchmark.md"),
        summary_html=reported(
            "benchmark.html", "Benchmark", "Tables", "benchmark summary"
        ),
        acceptance_length=reported(
            "plots/acceptance_length.png", "Benchmark", "Figures", "acceptance length"
        ),
        acceptance_per_position=reported(
            "plots/acceptance_per_position.png",
            "Benchmark",
            "Figures",
            "acceptance per position",
        ),
        throughput=reported(
            "plots/throughput.png", "Benchmark", "Figures", "throughput"
        ),
        data_report_html=reported("data_report.html", "Data", "Tables", "data report"),
        data_plot=reported("plots/data.png", "Data", "Figures", "tokens and cost"),
        plan_report_html=reported(
            "plan_report.html", "Extraction plan", "Tables", "plan report"
        ),
        training_loss=reported("plots/training_loss.png", "Training", "Figures", "loss"),
        training_accuracy=reported(
            "plots/training_accuracy.png", "Training", "Figures", "accuracy"
        ),
    log:
        f"{LOGS}/report/{config['experiment']}.log",
    benchmark:
        f"benchmarks/report/{config['experiment']}.tsv"
    conda:
        "../envs/data.yaml"
    resources:
        mem_mb=1000,
    script:
        "../scripts/report.py"


onsuccess:
    write_html_report(workflow, PLAN.results_dir / "report.html")
