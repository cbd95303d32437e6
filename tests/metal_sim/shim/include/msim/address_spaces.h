// Metal's address spaces as clang address spaces, so mixing them is a
// compile error as with Apple's compiler. `thread` is the default space.
// Force-included after preprocessing (see rewrite.py): the keywords stay
// plain tokens while the rewriter looks at the source.
#pragma once

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define threadgroup_imageblock __attribute__((address_space(3)))
#define thread
