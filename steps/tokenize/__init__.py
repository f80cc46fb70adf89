"""The Tokenize step (processing container): reviews in, validated and tokenized Parquet splits out."""
