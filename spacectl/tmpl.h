/*
 * tmpl.h — spacectl's template commands (cmd_template.c) and builds
 * (tmpl_build.c): docs/templates.md.
 */
#ifndef SPACECTL_TMPL_H
#define SPACECTL_TMPL_H

#include <stddef.h>

#include <jansson.h>

/* One JSON call to the control plane (SPACED_CP_URL, SPACED_API_KEY); on a
 * 2xx answer *out receives it (decref it) and 0 is returned, else the error
 * is printed and 1 returned. */
int tmpl_api(const char *what, const char *method, const char *path, json_t *req, json_t **out);

/* The store's base URL (GET /v1/store) into out. 0 or 1 (printed). */
int tmpl_store_url(const char *what, char *out, size_t outsz);

/* PUTs the file to store_url+path, streamed, and waits (up to 10 minutes)
 * for the JSON answer: 0 with *out, or 1 (printed). */
int tmpl_upload(const char *what, const char *store_url, const char *path, const char *file, json_t **out);

/* The same with POST and a JSON body read from file (a long call of the store). */
int tmpl_post_file(const char *what, const char *store_url, const char *path, const char *file, json_t **out);

/* spacectl template build NAME -f SPACEFILE [--context DIR] [--no-cache] [--json] */
int tmpl_build(int argc, char **argv);

/* spacectl template … */
int cmd_template(int argc, char **argv);

#endif
