"""The compat matrix: what passes where. schema (rows and their validation), store (the file, merged
without losing rows), render (README section and HTML page)."""
