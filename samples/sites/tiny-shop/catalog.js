// The shop's products, shared by its pages.
const PRODUCTS = {
  socks: {name: 'Red socks', price: 4.50},
  hat: {name: 'Blue hat', price: 12.00},
  scarf: {name: 'Green scarf', price: 9.00},
  mug: {name: 'White mug', price: 6.00},
};

function cart() {
  return JSON.parse(localStorage.getItem('cart') || '{}');
}
