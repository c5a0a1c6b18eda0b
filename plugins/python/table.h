/* The stream and size of each live CuPy block (table.c): CuPy's free hook
 * is given neither, and a free in stream order needs the stream the block
 * was allocated on. Thread-safe. */
#ifndef SA_PLUGINS_PYTHON_TABLE_H
#define SA_PLUGINS_PYTHON_TABLE_H

#include <stdbool.h>
#include <stddef.h>

#include <streamarena/streamarena.h>

/* Remember p (not NULL, not present) with its stream and size.
 * SA_ERR_OUT_OF_MEMORY when the table cannot grow (nothing changes). */
sa_status sa__py_table_put(void *p, sa_stream stream, size_t size);

/* Forget p, returning what was remembered; false when p is not present. */
bool sa__py_table_take(void *p, sa_stream *stream, size_t *size);

/* Blocks remembered now. */
size_t sa__py_table_count(void);

#endif /* SA_PLUGINS_PYTHON_TABLE_H */
