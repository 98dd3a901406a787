"""Tables and plots of the benchmark results, and the documents' generated blocks.

``python -m benchmarks.report.doc_tables --check`` compares README.md's and docs/*.md's
generated blocks with what results/ gives; ``--write`` regenerates them.
"""
