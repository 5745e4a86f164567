# Reports: figures, the benchmark summary (results/<experiment>/benchmark.md) and HTML
# pages of the data report, the hidden-state estimate and the benchmark, all marked for `snakemake --report`.
# Snakemake's HTML report shows HTML and images inline (Markdown only as a download),
# hence the HTML pages. After rule `report`,
# rule `report_html` writes results/<experiment>/report.html (src/draftsmith/report/workflow.py).

from draftsmith.report.workflow import (
    ReportedFiles,
    remember_command_line,
    write_html_report,
)

remember_command_line()

reported = ReportedFiles(PLAN.results_dir, config["experiment"])


rule report:
    input:
        **by_content(
            data_report=str(PLAN.merged.path("report")),
            data_report_md=str(PLAN.merged.path("report_md")),
            train_summary=str(PLAN.train.path("summary")),
            metrics=[str(PLAN.metrics(i)) for i in range(PLAN.num_segments)],
            benchmark=(
                [str(PLAN.evaluate.path("json"))]
                if stage_on(config, "evaluate")
                else []
            ),
            serve_benchmark=(
                [str(PLAN.serve_bench.path("md"))]
                if stage_on(config, "serve_bench")
                else []
            ),
            serve_benchmark_json=(
                [str(PLAN.serve_bench.path("json"))]
                if stage_on(config, "serve_bench")
                else []
            ),
            search=(
                [str(PLAN.search.path("json"))] if stage_on(config, "search") else []
            ),
        ),
        # Written in this run when the estimate changes: compared by time, like results/.
        estimate=str(PLAN.result("estimate")),
        estimate_md=str(PLAN.result("estimate_md")),
    output:
        summary=str(PLAN.result("summary")),
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
        estimate_html=reported(
            "hidden_estimate.html", "Hidden-state estimate", "Tables", "estimate"
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
    params:
        settings=SETTINGS.report,
    script:
        "../scripts/report.py"


# A rule of its own (not an end-of-run hook) so a missing report.html, after a kill
# included, is rebuilt like any other output. It runs in the snakemake process: the
# report run repeats this run's command line.
localrules:
    report_html,


rule report_html:
    input:
        rules.report.output,
    output:
        str(PLAN.result("html_report")),
    log:
        f"{LOGS}/report/{config['experiment']}-html.log",
    run:
        write_html_report(output[0], log[0], workflow.workdir_init)
