"""SageMaker Pipelines workflow that fine-tunes BERT on AWS Trainium: config, DAG, CLI."""
