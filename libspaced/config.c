/* config.c — a daemon's options from a file (see config.h). */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_MAX_BYTES (64 * 1024)
#define CONFIG_MAX_OPTIONS 256

static bool valid_name(const char *s)
{
	if (!islower((unsigned char)*s))
		return false;
	for (; *s; s++)
		if (!(islower((unsigned char)*s) || isdigit((unsigned char)*s) || *s == '-'))
			return false;
	return true;
}

int spaced_config_expand(int argc, char **argv, int *out_argc, char ***out_argv, char *err, size_t errsz)
{
	const char *file = NULL;
	int at = -1;
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], "--config") == 0) {
			file = argv[i + 1];
			at = i;
			break;
		}
	*out_argc = argc;
	*out_argv = argv;
	if (!file)
		return 0;
	FILE *f = fopen(file, "r");
	if (!f) {
		snprintf(err, errsz, "cannot read %s: %s", file, strerror(errno));
		return -1;
	}
	char *text = calloc(1, CONFIG_MAX_BYTES + 2);
	size_t n = text ? fread(text, 1, CONFIG_MAX_BYTES + 1, f) : 0;
	fclose(f);
	if (!text || n > CONFIG_MAX_BYTES) {
		snprintf(err, errsz, "%s: larger than %d bytes", file, CONFIG_MAX_BYTES);
		free(text);
		return -1;
	}
	char **nv = calloc((size_t)argc + 2 * CONFIG_MAX_OPTIONS + 1, sizeof *nv);
	if (!nv) {
		free(text);
		snprintf(err, errsz, "out of memory");
		return -1;
	}
	int nc = 0, lineno = 0, opts = 0;
	nv[nc++] = argv[0];
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		lineno++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = '\0';
		while (*line == ' ' || *line == '\t')
			line++;
		size_t l = strlen(line);
		while (l > 0 && (line[l - 1] == ' ' || line[l - 1] == '\t' || line[l - 1] == '\r'))
			line[--l] = '\0';
		if (l == 0)
			continue;
		char *sp = line + strcspn(line, " \t");
		char *value = NULL;
		if (*sp) {
			*sp++ = '\0';
			while (*sp == ' ' || *sp == '\t')
				sp++;
			value = sp;
		}
		if (!valid_name(line) || strcmp(line, "config") == 0 || ++opts > CONFIG_MAX_OPTIONS) {
			snprintf(err, errsz, "%s line %d: not an option name (a-z, 0-9, -) or too many options", file, lineno);
			goto fail;
		}
		size_t ol = strlen(line) + 3;
		char *opt = malloc(ol);
		if (!opt) {
			snprintf(err, errsz, "out of memory");
			goto fail;
		}
		snprintf(opt, ol, "--%s", line);
		nv[nc++] = opt;
		if (value)
			nv[nc++] = strdup(value);
	}
	for (int i = 1; i < argc; i++)
		if (i != at && i != at + 1)
			nv[nc++] = argv[i];
	nv[nc] = NULL;
	*out_argc = nc;
	*out_argv = nv;
	/* text is referenced by nothing now (values were copied) */
	free(text);
	return 0;
fail:
	for (int i = 1; i < nc; i++)
		free(nv[i]);
	free(nv);
	free(text);
	return -1;
}
