"""What runs a job: logging, signals and parent watching (`jobs`), managed process groups
(`process`, `process_guard`), GPU leases (`gpus`), each rule's threads and GPUs
(`resources`), SGLang launch arguments (`sglang`)."""
