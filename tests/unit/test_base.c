/* test_base.c - daemon/base: strict number parsing and error messages. */
#include <errno.h>
#include <string.h>

#include "base/err.h"
#include "base/parse.h"
#include "t.h"

static void test_parse_u64(void)
{
	struct k3_err err = { 0, "" };
	uint64_t v = 7;

	T_EQ_INT(k3_parse_u64("42", 0, 100, &v, &err), 0);
	T_EQ_U64(v, 42);
	T_EQ_INT(k3_parse_u64("18446744073709551615", 0, UINT64_MAX, &v, &err), 0);
	T_EQ_U64(v, UINT64_MAX);
	v = 7;
	T_EQ_INT(k3_parse_u64("18446744073709551616", 0, UINT64_MAX, &v, &err), -ERANGE);
	T_EQ_U64(v, 7);   /* unchanged on failure */
	T_EQ_INT(k3_parse_u64("101", 0, 100, &v, &err), -ERANGE);
	T_OK(strstr(err.msg, "out of range [0, 100]") != NULL);
	T_EQ_INT(k3_parse_u64("", 0, 100, &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_u64("-1", 0, 100, &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_u64("+1", 0, 100, &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_u64(" 1", 0, 100, &v, &err), -EINVAL);
	T_EQ_INT(k3_parse_u64("1x", 0, 100, &v, &err), -EINVAL);
	T_OK(strstr(err.msg, "'1x'") != NULL);
	T_EQ_INT(k3_parse_u64(NULL, 0, 100, &v, NULL), -EINVAL);
	T_EQ_INT(k3_parse_u64("3", 5, 100, &v, NULL), -ERANGE);
}

static void test_parse_double(void)
{
	struct k3_err err = { 0, "" };
	double d = 0;

	T_EQ_INT(k3_parse_double("2.5", 0, 10, &d, &err), 0);
	T_NEAR(d, 2.5, 0);
	T_EQ_INT(k3_parse_double("1e3", 0, 1e4, &d, &err), 0);
	T_NEAR(d, 1000, 0);
	T_EQ_INT(k3_parse_double("nan", 0, 10, &d, &err), -EINVAL);
	T_EQ_INT(k3_parse_double("inf", 0, 10, &d, &err), -EINVAL);
	T_EQ_INT(k3_parse_double("11", 0, 10, &d, &err), -ERANGE);
	T_EQ_INT(k3_parse_double("", 0, 10, &d, &err), -EINVAL);
	T_EQ_INT(k3_parse_double("2.5s", 0, 10, &d, &err), -EINVAL);
}

static void test_err(void)
{
	struct k3_err err = { 0, "" };
	char big[2 * K3_ERR_MSG_MAX];

	T_EQ_INT(k3_err_set(&err, -ENOENT, "cannot open '%s'", "x"), -ENOENT);
	T_EQ_INT(err.code, -ENOENT);
	T_EQ_STR(err.msg, "cannot open 'x'");
	T_EQ_INT(k3_err_prefix(&err, "model '%s'", "m"), -ENOENT);
	T_EQ_STR(err.msg, "model 'm': cannot open 'x'");
	T_EQ_INT(k3_err_set(NULL, -EIO, "dropped"), -EIO);
	T_EQ_INT(k3_err_prefix(NULL, "x"), -EINVAL);
	/* Long messages are truncated, never overflow, and stay terminated. */
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	k3_err_set(&err, -E2BIG, "%s", big);
	T_EQ_INT(strlen(err.msg), K3_ERR_MSG_MAX - 1);
	k3_err_prefix(&err, "%s", big);
	T_EQ_INT(strlen(err.msg), K3_ERR_MSG_MAX - 1);
	k3_err_set(&err, -E2BIG, "tail");
	k3_err_prefix(&err, "%s", big);
	T_OK(strncmp(err.msg, "aaaa", 4) == 0);
}

int main(void)
{
	test_parse_u64();
	test_parse_double();
	test_err();
	return t_done();
}
