/*
 * test_config.c — a daemon's options from its configuration file
 * (libspaced/config.c): the file's options first, the command line's after,
 * comments and blank lines ignored, anything else refused with its line.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

static char path[64];

/* A writable argv (string literals are const here). */
static char **mkargv(const char *const *in)
{
	int n = 0;
	while (in[n])
		n++;
	char **v = calloc((size_t)n + 1, sizeof *v);
	for (int i = 0; i < n; i++)
		v[i] = strdup(in[i]);
	return v;
}

static void write_file(const char *text)
{
	snprintf(path, sizeof path, "/tmp/spaced-config-test-%d", (int)getpid());
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

Test(config, file_options_come_first)
{
	write_file("# a worker\nstate /var/lib/spaced-node\n\nlisten 127.0.0.1:7801  # the API\n  no-drop\n"
	           "limits-default cpus=1,memory=512M\n");
	const char *a[] = {"spaced-node", "--config", path, "--listen", "127.0.0.1:9999", NULL};
	char **argv = mkargv(a);
	int n;
	char **v, err[128];
	cr_assert_eq(spaced_config_expand(5, argv, &n, &v, err, sizeof err), 0, "%s", err);
	const char *want[] = {"spaced-node", "--state", "/var/lib/spaced-node", "--listen", "127.0.0.1:7801",
	                      "--no-drop", "--limits-default", "cpus=1,memory=512M", "--listen", "127.0.0.1:9999"};
	cr_assert_eq(n, 10);
	for (int i = 0; i < n; i++)
		cr_expect_str_eq(v[i], want[i], "argv[%d]", i);
	cr_expect_null(v[n]);
	unlink(path);
}

Test(config, without_config_argv_is_untouched)
{
	const char *a[] = {"spaced-node", "--listen", "x", NULL};
	char **argv = mkargv(a);
	int n;
	char **v, err[128];
	cr_assert_eq(spaced_config_expand(3, argv, &n, &v, err, sizeof err), 0);
	cr_expect_eq(v, argv);
	cr_expect_eq(n, 3);
}

Test(config, bad_files_are_refused_with_their_line)
{
	int n;
	char **v, err[128];
	write_file("listen 1\n--state x\n");
	const char *a[] = {"d", "--config", path, NULL};
	char **argv = mkargv(a);
	cr_expect_eq(spaced_config_expand(3, argv, &n, &v, err, sizeof err), -1);
	cr_expect(strstr(err, "line 2") != NULL, "%s", err);
	write_file("config /etc/other\n");
	cr_expect_eq(spaced_config_expand(3, argv, &n, &v, err, sizeof err), -1, "a file naming another file");
	unlink(path);
	cr_expect_eq(spaced_config_expand(3, argv, &n, &v, err, sizeof err), -1, "a missing file");
	cr_expect(strstr(err, "cannot read") != NULL, "%s", err);
}
