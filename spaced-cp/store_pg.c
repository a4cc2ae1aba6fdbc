/* store_pg.c — the PostgreSQL backend (libpq): the same SQL as SQLite, text
 * parameters, row locks taken by the UPDATE statements inside BEGIN … COMMIT. */
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "spaced_error.h"
#include "store.h"

static int map_res(PGresult *res)
{
	ExecStatusType s = PQresultStatus(res);
	if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK)
		return 0;
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	if (state != NULL && strcmp(state, "23505") == 0)
		return SPACED_EEXIST;
	if (state != NULL && (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0 ||
	                      strcmp(state, "55P03") == 0))
		return SPACED_EBUSY;
	return SPACED_EIO;
}

static int pg_script(void *h, const char *sql)
{
	PGresult *res = PQexec(h, sql);
	int r = map_res(res);
	PQclear(res);
	return r;
}

static int pg_begin(void *h)
{
	return pg_script(h, "BEGIN");
}

static int pg_commit(void *h)
{
	return pg_script(h, "COMMIT");
}

static void pg_rollback(void *h)
{
	if (PQtransactionStatus(h) != PQTRANS_IDLE)
		pg_script(h, "ROLLBACK");
}

static int pg_exec(void *h, const char *sql, int n, const char *const *params, struct cp_rows **out,
                   long *changes)
{
	struct cp_rows *rows = NULL;
	PGresult *res = PQexecParams(h, sql, n, NULL, params, NULL, NULL, 0);
	int r = map_res(res);
	if (r < 0)
		goto out;
	int nr = PQntuples(res), nc = PQnfields(res);
	rows = cp_rows_new(nr, nc);
	if (rows == NULL) {
		r = SPACED_ENOMEM;
		goto out;
	}
	for (int i = 0; i < nr; i++)
		for (int c = 0; c < nc; c++) {
			if (PQgetisnull(res, i, c))
				continue;
			if ((rows->v[i * nc + c] = strdup(PQgetvalue(res, i, c))) == NULL) {
				r = SPACED_ENOMEM;
				goto out;
			}
		}
	if (changes != NULL)
		*changes = strtol(PQcmdTuples(res), NULL, 10);
	if (out != NULL) {
		*out = rows;
		rows = NULL;
	}
out:
	cp_rows_free(rows);
	PQclear(res);
	return r;
}

static void pg_close(void *h)
{
	PQfinish(h);
}

static const struct cp_store_ops pg_ops = {
	.kind = "postgresql",
	.begin = pg_begin,
	.commit = pg_commit,
	.rollback = pg_rollback,
	.exec = pg_exec,
	.script = pg_script,
	.close = pg_close,
};

int cp_store_pg_open(const char *conninfo, void **h, const struct cp_store_ops **ops)
{
	PGconn *c = PQconnectdb(conninfo);
	if (c == NULL)
		return SPACED_ENOMEM;
	if (PQstatus(c) != CONNECTION_OK) {
		PQfinish(c);
		return SPACED_EIO;
	}
	/* Quiet NOTICEs ("relation already exists, skipping") and bound lock waits. */
	PGresult *res = PQexec(c, "SET client_min_messages = warning; SET lock_timeout = '10s'");
	PQclear(res);
	*h = c;
	*ops = &pg_ops;
	return 0;
}
